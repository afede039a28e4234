"""cache_zeros: zeros of any cache dtype, writable views; on the CPU the pages are mapped in as
they are touched (a cache's budget is not written at the engine's start)."""

from __future__ import annotations

import pytest
import torch

from minivllm.engine.runner.cache.cache_memory import cache_zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_zeros_of_the_shape_and_dtype_and_writable(dtype: torch.dtype) -> None:
    t = cache_zeros((2, 3, 5, 4), dtype, torch.device("cpu"))
    assert t.shape == (2, 3, 5, 4) and t.dtype == dtype and t.device.type == "cpu"
    assert torch.equal(t.float(), torch.zeros(2, 3, 5, 4))
    t[1, 2] = 1
    assert t.float().sum() == 20 and t.is_contiguous()
    assert cache_zeros((0, 4), dtype, torch.device("cpu")).shape == (0, 4)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_untouched_pages_take_no_memory() -> None:
    before = _resident_bytes()
    t = cache_zeros((1 << 28,), torch.float32, torch.device("cpu"))  # 1 GiB
    t[: 1 << 20] = 2.0  # 4 MiB touched
    grown = _resident_bytes() - before
    assert grown < 256 << 20, f"{grown / 2**20:.0f} MiB resident for 4 MiB touched"
    assert t[(1 << 20) - 1] == 2.0 and t[-1] == 0.0
