"""One module per group of ``streamrec`` subcommands, each with ``register(sub, common)``."""
