"""Deterministic mode's attention kernels, compiled for Hopper (sm_90) without a GPU by
benchmarks/kernel_resources.py: each launch fits a block's shared memory (a launch past it fails
on the GPU), and ptxas reports no performance loss (a fold that reads accumulators still in
flight made it serialize every warpgroup MMA of the kernel: warning C7515)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_resources.py"
VARIANTS = ("bi_walk", "bi_walk_decode", "bi_split_decode")


@pytest.fixture(scope="module")
def resources() -> dict:
    triton = pytest.importorskip("triton")
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this triton has no ptxas to compile for sm_90 with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", ",".join(VARIANTS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_deterministic_attention_fits_and_keeps_its_mmas_async(resources, variant):
    figures = resources[variant]
    assert figures["ctas_per_sm"] >= 1, f"{variant} needs {figures['shared']} B of shared memory"
    assert figures["perf_loss"] is None, f"{variant}: {figures['perf_loss']}"
