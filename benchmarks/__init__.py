"""Benchmark scripts, run from the repository root as modules:
`python -m benchmarks.FOLDER.NAME` (README.md lists them)."""
