"""Benchmark scripts: each measures its own baseline in the same run and prints ratios."""
