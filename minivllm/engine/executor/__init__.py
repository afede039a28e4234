"""Executors: where a step runs (one device, tensor-parallel ranks) and how it gets there."""
