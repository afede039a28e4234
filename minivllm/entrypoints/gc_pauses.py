"""Fewer full garbage collections while LLM.generate runs its loop.

The offline loop keeps every finished RequestOutput until it returns (a thousand chat requests
asking for 5 logprobs hold ~200k Logprob objects and their dicts). CPython walks all of them at
each full (generation-2) collection, which by default comes after ten generation-1 ones: on a
busy engine that is every ~80 steps, and each pause (~0.1-0.3 s at that size) stalls the GPU,
since the loop that launches the next step is the one that pauses. vLLM's frontend pauses
too, but in its own process beside the engine's. Here the full collections are made ten times
rarer while the loop runs; the young generations, where a step's garbage dies, are collected
as before, and the threshold is restored when the loop ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Generation-1 collections between full ones while the loop runs (CPython's default: 10).
FULL_COLLECTION_EVERY = 100


@contextlib.contextmanager
def fewer_full_collections() -> Iterator[None]:
    """Raises the generation-2 threshold to FULL_COLLECTION_EVERY for the block (never
    lowers it), then puts back what it was."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], max(before[2], FULL_COLLECTION_EVERY))
    try:
        yield
    finally:
        gc.set_threshold(*before)
