"""A constrained step's bitmask under tensor parallelism: rank 0 fills it (while the forward
runs) and sends it, as plain int32 bytes, to the other ranks, which apply the same mask
before they sample the same tokens.

The step message carries the constrained rows; the mask follows it as the next message on
the same channel, written once rank 0 has filled it and read where each worker's runner asks
for it (StepMask.fill, after launching the forward). Every rank runs the same code, so a step
that fails before its fill fails before it on every rank: then no mask is sent, none read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from minivllm.structured_output.bitmask import StepMask

# Sent instead of the mask when rank 0's fill raised: the workers raise too, so the step
# fails on every rank and they stay in step.
_FILL_FAILED = b""
# Masks a worker's runner may still be copying to its device (a launched step and the one
# being collected) plus the one being received.
_NUM_BUFFERS = 3


class SentMask:
    """Rank 0's StepMask: fills through the scheduler's mask, then sends it (send: the
    executor's write to the workers)."""

    def __init__(self, mask: StepMask, send: Callable[[bytes | memoryview], None]) -> None:
        self.rows = mask.rows
        self._mask = mask
        self._send = send

    def fill(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            bitmask, rows = self._mask.fill()
        except BaseException:
            self._send(_FILL_FAILED)
            raise
        # bitmask: rows of the manager's buffer (contiguous), so its bytes go without a copy.
        self._send(memoryview(bitmask.contiguous().numpy()).cast("B"))
        return bitmask, rows


class MaskReceiver:
    """A worker's side: StepMasks whose fill() reads the mask rank 0 sent into reused host
    buffers (pinned on CUDA: the runner's copies to the device stay asynchronous).

    receive: the next message from rank 0; max_rows: the most rows of one mask. A buffer
    is reused _NUM_BUFFERS masks later: by then the step that copied it has been collected
    (a worker holds at most two launched steps, as rank 0 does).
    """

    def __init__(self, receive: Callable[[], bytes], max_rows: int, pin_memory: bool) -> None:
        self._receive = receive
        self._max_rows = max_rows
        self._pin_memory = pin_memory
        self._buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._num_received = 0

    def expect(self, rows: Sequence[int]) -> StepMask:
        """The StepMask of a step whose constrained rows are rows."""
        return _ReceivedMask(rows, self)

    def receive(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The next mask: bitmask int32 [len(rows), num_words] and rows int64 [len(rows)]."""
        data = self._receive()
        n = len(rows)
        if data == _FILL_FAILED:
            raise RuntimeError("rank 0 could not fill the structured output bitmask")
        if not 0 < n <= self._max_rows or len(data) % (4 * n):
            raise RuntimeError(f"a {len(data)}-byte bitmask does not have {n} rows")
        words = np.frombuffer(data, dtype=np.int32).reshape(n, -1)
        bitmask, row_ids = self._next_buffers(words.shape[1])
        bitmask, row_ids = bitmask[:n], row_ids[:n]
        bitmask.numpy()[:] = words
        row_ids.numpy()[:] = rows
        return bitmask, row_ids

    def _next_buffers(self, num_words: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._buffers or self._buffers[0][0].shape[1] != num_words:
            # Allocated once (the mask's width is the model's): pinning memory in a step
            # would synchronize the device.
            pin, rows = self._pin_memory, self._max_rows
            self._buffers = [
                (
                    torch.empty((rows, num_words), dtype=torch.int32, pin_memory=pin),
                    torch.empty(rows, dtype=torch.int64, pin_memory=pin),
                )
                for _ in range(_NUM_BUFFERS)
            ]
        self._num_received += 1
        return self._buffers[self._num_received % _NUM_BUFFERS]


class _ReceivedMask:
    """A worker's StepMask for one step: fill() waits for rank 0's mask."""

    def __init__(self, rows: Sequence[int], receiver: MaskReceiver) -> None:
        self.rows = rows
        self._receiver = receiver

    def fill(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._receiver.receive(self.rows)
