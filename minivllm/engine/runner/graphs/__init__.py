"""CUDA graphs: decode steps (full, hybrid), mixed steps (piecewise), and their capture."""
