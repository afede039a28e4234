"""Host data to the device through pinned memory, so that copies are asynchronous: a step's
arrays in one copy through a ring of pinned staging buffers (InputStaging), and small lists
(penalty and min_tokens id lists); and a step's results back (HostCopy, into HostBufferRing)."""

from __future__ import annotations

import numpy as np
import torch

_ALIGN = 8  # bytes: every part starts at a multiple of the widest element (int64)


def copy_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on `device`. On CUDA it goes through pinned memory (the caching host
    allocator reuses it once the copy is done): an asynchronous copy that does not wait for
    the GPU to drain."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def list_to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (nested, rectangular) list of numbers as one tensor on `device`, one copy."""
    return copy_to_device(torch.tensor(data, dtype=dtype), device)


class InputStaging:
    """Copies a step's arrays (any mix of int64 / int32 / float32) to the device in ONE
    transfer from a pinned buffer that lives across steps.

    On CUDA a step needs no pinned allocation (a miss of the caching host allocator calls
    cudaHostAlloc, which waits for the device) and no per-dtype copies. The buffers form a
    ring; each slot's copy records an event that the slot's next use waits on, so a slot is
    never overwritten while its copy may still read it (with two steps in flight at most, the
    wait is for a copy that finished long ago). On the CPU the arrays are packed the same way
    into a fresh buffer (the device views alias it, nothing is copied).
    """

    def __init__(self, device: torch.device, num_slots: int = 3, capacity: int = 1 << 16) -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self._slots: list[torch.Tensor] = []
        self._events: list[torch.cuda.Event | None] = [None] * num_slots
        if self.is_cuda:
            self._slots = [self._pinned(capacity) for _ in range(num_slots)]
        self._next = 0

    @staticmethod
    def _pinned(nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def upload(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The arrays on the device, same names, shapes and dtypes (int64, int32 or float32)."""
        offsets, nbytes = {}, 0
        for name, array in arrays.items():
            offsets[name] = nbytes
            nbytes += -(-array.nbytes // _ALIGN) * _ALIGN
        host = self._host_buffer(nbytes)
        host_np = host.numpy()
        for name, array in arrays.items():
            start = offsets[name]
            host_np[start : start + array.nbytes].view(array.dtype)[:] = array.reshape(-1)
        packed = host[:nbytes].to(self.device, non_blocking=True) if self.is_cuda else host
        if self.is_cuda:
            event = torch.cuda.Event()
            event.record()
            self._events[self._next] = event
            self._next = (self._next + 1) % len(self._slots)
        out = {}
        for name, array in arrays.items():
            start = offsets[name]
            part = packed[start : start + array.nbytes].view(_torch_dtype(array.dtype))
            out[name] = part.view(array.shape)
        return out

    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        if not self.is_cuda:
            return torch.empty(max(nbytes, _ALIGN), dtype=torch.uint8)
        event = self._events[self._next]
        if event is not None:
            event.synchronize()  # the slot's last copy (two steps ago): long done
        if self._slots[self._next].numel() < nbytes:
            # Rare (a step larger than any before): pinned allocation, which may wait.
            self._slots[self._next] = self._pinned(max(nbytes, 2 * self._slots[self._next].numel()))
        return self._slots[self._next]


_TORCH_DTYPES = {
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.float32): torch.float32,
}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    if dtype not in _TORCH_DTYPES:
        raise TypeError(f"InputStaging takes int64, int32 and float32 arrays, got {dtype}")
    return _TORCH_DTYPES[dtype]


class HostCopy:
    """A device tensor copied into a pinned host buffer behind the kernels that made it:
    tolist() waits for that copy alone, not for later work on the stream (under async
    scheduling the next step's forward is queued behind it). Without a buffer (the CPU),
    the tensor itself.

    buffer: 8-byte elements (int64 or float64, as t), at least t.numel() of them (the
    runner's ring), or any elements of at least t's bytes, or None."""

    def __init__(self, t: torch.Tensor, buffer: torch.Tensor | None) -> None:
        self.host, self.event = t, None
        if buffer is not None:
            self.host = buffer.view(t.dtype)[: t.numel()].view(t.shape)
            self.host.copy_(t, non_blocking=True)
            if t.is_cuda:
                self.event = torch.cuda.Event()
                self.event.record()

    def tolist(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()

    def numpy(self) -> np.ndarray:
        """A copy of the values (the buffer is reused by a later step)."""
        if self.event is not None:
            self.event.synchronize()
        return self.host.numpy().copy()


class HostBufferRing:
    """The pinned int64 buffers a step's sampled ids (and logprobs) are copied into (CUDA
    only; HostCopy's buffer).

    Steps in flight at once are at most two (launched, and being applied): a ring of three
    is never overwritten before it is read. Steps allocate no pinned memory (cudaHostAlloc
    synchronizes the device), but for a step larger than any before (drafts, or more than
    20 logprobs a row), whose slot then grows to it (a step in flight keeps the buffer it
    holds)."""

    def __init__(self, device: torch.device, max_num_seqs: int) -> None:
        self._buffers: list[torch.Tensor] = []
        if device.type == "cuda":
            # Sized for ids and up to 20 logprobs a row: a larger step grows its slot once.
            numel = max_num_seqs * (1 + 2 * 21 + 1)
            self._buffers = [
                torch.empty(numel, dtype=torch.int64, pin_memory=True) for _ in range(3)
            ]
        self._num_steps = 0

    def next(self, numel: int = 0) -> torch.Tensor | None:
        """The next buffer, of at least numel elements; None off CUDA."""
        if not self._buffers:
            return None
        self._num_steps += 1
        slot = self._num_steps % len(self._buffers)
        if self._buffers[slot].numel() < numel:
            size = max(numel, 2 * self._buffers[slot].numel())
            self._buffers[slot] = torch.empty(size, dtype=torch.int64, pin_memory=True)
        return self._buffers[slot]
