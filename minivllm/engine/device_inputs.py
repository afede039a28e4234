"""Host data to the device through pinned memory, so that copies are asynchronous: a step's
arrays in two packed copies (int64 and int32), and small lists (sampling parameters)."""

from __future__ import annotations

import numpy as np
import torch


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


def to_device(
    arrays: dict[str, np.ndarray], dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """Packs every array into one buffer of `dtype`, copies it once; returns device views."""
    np_dtype = np.int64 if dtype == torch.int64 else np.int32
    flat = [a.reshape(-1).astype(np_dtype, copy=False) for a in arrays.values()]
    host = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, np_dtype))
    packed = copy_to_device(host, device)
    out, offset = {}, 0
    for (name, array), part in zip(arrays.items(), flat):
        out[name] = packed[offset : offset + part.size].view(array.shape)
        offset += part.size
    return out
