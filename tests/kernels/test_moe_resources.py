"""The fused-MoE kernels compiled for Hopper (sm_90) without a GPU (tests/kernels/moe_resources.py,
Qwen3-30B-A3B's shapes in bf16, decode and prefill tiles): each launch fits a block's shared
memory and spills no registers."""

from __future__ import annotations

import pytest
from sm90_compile import compile_figures


@pytest.fixture(scope="module")
def resources() -> dict:
    return compile_figures(["-m", "tests.kernels.moe_resources"])


@pytest.mark.parametrize(
    "path",
    ["decode/gate_up", "decode/down", "prefill/gate_up", "prefill/down", "topk_sum", "router",
     "align", "gemv/gate_up", "gemv/down", "gemv_fp8/gate_up", "gemv_fp8/down"],
)  # fmt: skip
def test_fits_and_does_not_spill(resources, path: str) -> None:
    figures = resources
    for key in path.split("/"):
        figures = figures[key]
    assert figures["ctas_per_sm"] >= 1, f"{path} needs {figures['shared']} B of shared memory"
    assert figures["spill_bytes"] == 0, f"{path} spills: {figures}"


def test_decode_and_prefill_tiles_differ(resources) -> None:
    assert (resources["decode"]["block_m"], resources["prefill"]["block_m"]) == (16, 64)
