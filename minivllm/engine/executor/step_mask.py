"""A step's grammar output under tensor parallelism: rank 0's scheduler fills the bitmask while
the forward runs; rank 0 sends it, as plain int32 bytes right after the SAMPLE message that
carries its rows, and the other ranks apply the same mask before they sample the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from minivllm.engine.executor.step_codec import Op, encode_sample
from minivllm.engine.types import GrammarOutput

# Masks a worker's runner may still be copying to its device (a launched step and the one
# being collected) plus the one being received.
_NUM_BUFFERS = 3


def send_sample(
    write: Callable[[bytes | memoryview], None], op: Op, grammar: GrammarOutput | None
) -> None:
    """The SAMPLE message of a step, then its bitmask (without a copy: rows of the
    scheduler's contiguous buffer)."""
    write(encode_sample(op, grammar))
    if grammar is not None:
        write(memoryview(np.ascontiguousarray(grammar.bitmask)).cast("B"))


class GrammarReceiver:
    """A worker's side: the bitmask that follows a SAMPLE message, read into reused host
    buffers (pinned on CUDA: the runner's copy to the device stays asynchronous).

    receive: the next message from rank 0; max_rows: the most rows of one mask. A buffer
    is reused _NUM_BUFFERS masks later: by then the step that copied it has been collected
    (a worker holds at most two launched steps, as rank 0 does).
    """

    def __init__(self, receive: Callable[[], bytes], max_rows: int, pin_memory: bool) -> None:
        self._receive = receive
        self._max_rows = max_rows
        self._pin_memory = pin_memory
        self._buffers: list[np.ndarray] = []
        self._num_received = 0

    def receive(self, rows: list[int]) -> GrammarOutput:
        """The grammar output of a SAMPLE message whose rows are rows: its bitmask int32
        [len(rows), num_words], the next message."""
        data = self._receive()
        n = len(rows)
        if not 0 < n <= self._max_rows or len(data) % (4 * n):
            raise RuntimeError(f"a {len(data)}-byte bitmask does not have {n} rows")
        words = np.frombuffer(data, dtype=np.int32).reshape(n, -1)
        bitmask = self._next_buffer(words.shape[1])[:n]
        bitmask[:] = words
        return GrammarOutput(rows, bitmask)

    def _next_buffer(self, num_words: int) -> np.ndarray:
        if not self._buffers or self._buffers[0].shape[1] != num_words:
            # Allocated once (the mask's width is the model's): pinning memory in a step
            # would synchronize the device.
            shape = (self._max_rows, num_words)
            self._buffers = [
                torch.empty(shape, dtype=torch.int32, pin_memory=self._pin_memory).numpy()
                for _ in range(_NUM_BUFFERS)
            ]
        self._num_received += 1
        return self._buffers[self._num_received % _NUM_BUFFERS]
