"""The caches' zeroed memory (the KV cache, the recurrent-state pool). On the CPU it comes from
calloc (numpy's zeros), whose large blocks the OS maps in zeroed at first touch: a cache sized
by its byte budget (kv_cache_memory, 1 GiB by default) costs the engine's start nothing and
takes host memory as its blocks are used, where torch.zeros writes every byte first (seconds
at 1 GiB). On a GPU: torch.zeros."""

from __future__ import annotations

import math

import numpy as np
import torch


def cache_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor of shape and dtype on device (any dtype: the bytes are viewed as it)."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = torch.from_numpy(np.zeros(nbytes, dtype=np.uint8))
    return raw.view(dtype).view(shape)
