"""Collectives for tensor parallelism on one node (all-reduce through symmetric memory)."""
