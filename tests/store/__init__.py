"""The embedding store: tiers, write-back cache, checkpoints, crash recovery, refusals."""
