"""The logprobs' two passes compiled for Hopper (sm_90) without a GPU
(tests/kernels/logprobs_resources.py: Qwen3's vocabulary, 1,024 rows, 20 top logprobs): each
variant compiles, fits a block's shared memory and spills no registers."""

from __future__ import annotations

import pytest
from sm90_compile import compile_figures


@pytest.fixture(scope="module")
def resources() -> dict:
    return compile_figures(["-m", "tests.kernels.logprobs_resources"])


VARIANTS = ["bfloat16/all", "bfloat16/rows", "float32/all", "float32/rows"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kernel", ["slices", "rows"])
def test_fits_and_does_not_spill(resources, variant: str, kernel: str) -> None:
    figures = resources[variant][kernel]
    assert figures["ctas_per_sm"] >= 1, f"{variant} {kernel}: {figures['shared']} B shared"
    assert figures["spill_bytes"] == 0, f"{variant} {kernel} spills: {figures}"
