"""torch's thread counts in a CPU engine's process: chosen from the usable cores unless the
user set OMP_NUM_THREADS (each case in a fresh process: thread counts are per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minivllm.cpu_threads import engine_threads

_CHILD = r"""
import sys, torch
from minivllm import LLM
from minivllm.cpu_threads import usable_cores
llm = LLM(sys.argv[1], device="cpu", dtype="float32", num_gpu_blocks_override=64, block_size=4)
print(usable_cores(), torch.get_num_threads(), torch.get_num_interop_threads())
llm.shutdown()
"""


def child(model_dir: str, omp: str | None) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, model_dir],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(word) for word in out.stdout.split()[-3:]]


def test_the_engine_chooses_from_the_usable_cores(tiny_qwen3_dir):
    cores, intra, inter = child(tiny_qwen3_dir, None)
    assert cores == len(os.sched_getaffinity(0))
    assert (intra, inter) == (engine_threads(cores), 1)


def test_usable_cores_follow_the_affinity():
    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from minivllm.cpu_threads import usable_cores; print(usable_cores())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "1", out.stderr[-2000:]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to tell apart")
def test_omp_num_threads_wins(tiny_qwen3_dir):
    cores = len(os.sched_getaffinity(0))  # torch takes at most this many; the engine, one less
    _, intra, _ = child(tiny_qwen3_dir, str(cores))
    assert intra == cores


def test_engine_threads_leave_a_core_to_the_rest():
    assert [engine_threads(n) for n in (1, 2, 4, 16)] == [1, 1, 3, 15]
