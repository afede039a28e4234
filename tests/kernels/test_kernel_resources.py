"""Deterministic mode's attention kernels, compiled for Hopper (sm_90) without a GPU by
benchmarks/kernels/kernel_resources.py: each launch fits a block's shared memory (a launch past
it fails on the GPU), and ptxas reports no performance loss (a fold that reads accumulators still in
flight made it serialize every warpgroup MMA of the kernel: warning C7515)."""

from __future__ import annotations

import pytest
from sm90_compile import compile_figures

MODULE = "benchmarks.kernels.kernel_resources"  # run from the repository root
VARIANTS = ("bi_walk", "bi_walk_decode", "bi_split_decode")


@pytest.fixture(scope="module")
def resources() -> dict:
    return compile_figures(["-m", MODULE, "--only", ",".join(VARIANTS)])


@pytest.mark.parametrize("variant", VARIANTS)
def test_deterministic_attention_fits_and_keeps_its_mmas_async(resources, variant):
    figures = resources[variant]
    assert figures["ctas_per_sm"] >= 1, f"{variant} needs {figures['shared']} B of shared memory"
    assert figures["perf_loss"] is None, f"{variant}: {figures['perf_loss']}"
