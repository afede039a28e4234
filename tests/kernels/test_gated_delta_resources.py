"""The gated delta kernels compiled for Hopper (sm_90) without a GPU
(tests/kernels/gated_delta_resources.py, Qwen3.5-9B's shapes in bf16): each launch fits a
block's shared memory and spills no registers (a tile too large for its warps spills to local
memory on every chunk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = (
    "_chunk_prepare_kernel", "_chunk_state_kernel", "_chunk_output_kernel",
    "_recurrent_step_kernel", "_conv1d_prefill_kernel", "_conv1d_update_kernel",
)  # fmt: skip


@pytest.fixture(scope="module")
def resources() -> dict:
    triton = pytest.importorskip("triton")
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("this triton has no ptxas to compile for sm_90 with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernels.gated_delta_resources"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("kernel", KERNELS)
def test_fits_and_does_not_spill(resources, kernel):
    figures = resources[kernel]
    assert figures["ctas_per_sm"] >= 1, f"{kernel} needs {figures['shared']} B of shared memory"
    assert figures["spill_bytes"] == 0, f"{kernel} spills: {figures}"
