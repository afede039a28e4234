"""Moves a step's host arrays to the device in two copies (int64 and int32 packs) through
pinned memory, so that the copies are asynchronous and the per-step cost does not grow with
the number of arrays."""

from __future__ import annotations

import numpy as np
import torch


def to_device(
    arrays: dict[str, np.ndarray], dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """Packs every array into one buffer of `dtype`, copies it once; returns device views."""
    np_dtype = np.int64 if dtype == torch.int64 else np.int32
    flat = [a.reshape(-1).astype(np_dtype, copy=False) for a in arrays.values()]
    host = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, np_dtype))
    if device.type == "cuda":
        # Pinned (the caching host allocator reuses it once the copy is done): a truly
        # asynchronous copy that does not wait for the GPU to drain.
        host = host.pin_memory()
    packed = host.to(device, non_blocking=True)
    out, offset = {}, 0
    for (name, array), part in zip(arrays.items(), flat):
        out[name] = packed[offset : offset + part.size].view(array.shape)
        offset += part.size
    return out
