"""Serving: the gRPC server, its clients, version swaps and restarts, refusals, the snapshot format."""
