"""Tensor parallelism on the CPU (gloo): TP=2 gives TP=1's greedy tokens; a dead worker is an
error, not a hang; no worker outlives its LLM."""

from __future__ import annotations

import os
import signal
import time

import pytest

from minivllm import LLM, SamplingParams

PROMPTS = [{"prompt_token_ids": [5, 17, 42, 99, 3]}, {"prompt_token_ids": list(range(40, 71))}]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def greedy(model_dir: str, tp: int, **options) -> list[list[int]]:
    llm = LLM(
        model_dir, dtype="float32", device="cpu", block_size=4, tensor_parallel_size=tp, **options
    )
    try:
        outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch_fixture", ["tiny_qwen3_dir", "tiny_llama_dir"])
def test_tp2_matches_tp1(arch_fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(arch_fixture)
    assert greedy(model_dir, 2) == greedy(model_dir, 1)


def test_killed_worker_raises(tiny_qwen3_dir: str) -> None:
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4, tensor_parallel_size=2)
    worker = llm.engine.executor.workers[0]
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=10)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert time.monotonic() - start < 30
    llm.shutdown()
    assert not any(w.is_alive() for w in llm.engine.executor.workers)


def test_shutdown_leaves_no_workers(tiny_qwen3_dir: str) -> None:
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4, tensor_parallel_size=2)
    workers = list(llm.engine.executor.workers)
    llm.shutdown()
    assert not any(w.is_alive() for w in workers)


def test_heads_not_divisible_by_tp_is_a_clear_error(tiny_qwen3_dir: str) -> None:
    # The tiny Qwen3 has 4 query heads: 3 ranks cannot split them.
    with pytest.raises(ValueError, match=r"\b4\b.*\b3\b|\b3\b.*\b4\b"):
        LLM(tiny_qwen3_dir, dtype="float32", device="cpu", tensor_parallel_size=3)
