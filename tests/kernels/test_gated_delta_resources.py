"""The gated delta kernels compiled for Hopper (sm_90) without a GPU
(tests/kernels/gated_delta_resources.py, Qwen3.5-9B's shapes in bf16): each launch fits a
block's shared memory and spills no registers (a tile too large for its warps spills to local
memory on every chunk)."""

from __future__ import annotations

import pytest
from sm90_compile import compile_figures

KERNELS = (
    "_chunk_prepare_kernel", "_chunk_state_kernel", "_chunk_output_kernel",
    "_recurrent_step_kernel", "_conv1d_prefill_kernel", "_conv1d_update_kernel",
)  # fmt: skip


@pytest.fixture(scope="module")
def resources() -> dict:
    return compile_figures(["-m", "tests.kernels.gated_delta_resources"])


@pytest.mark.parametrize("kernel", KERNELS)
def test_fits_and_does_not_spill(resources, kernel):
    figures = resources[kernel]
    assert figures["ctas_per_sm"] >= 1, f"{kernel} needs {figures['shared']} B of shared memory"
    assert figures["spill_bytes"] == 0, f"{kernel} spills: {figures}"
