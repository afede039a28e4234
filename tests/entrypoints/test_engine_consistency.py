"""The engine agrees with itself, greedy: prefix caching, chunked prefill, preemption and a
single seat change the schedule, never the tokens."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams

SHARED = list(range(30, 70))  # 40 tokens: 10 full blocks of 4
PROMPTS = [SHARED + [1, 2, 3], SHARED + [4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1], SHARED[:17]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def run(model_dir: str, **options) -> tuple[list[list[int]], list[int]]:
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4, **options)
    tokens, cached = [], []
    for _ in range(2):  # the second round can hit the prefix cache
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
        tokens.append([o.outputs[0].token_ids for o in outs])
        cached.append([o.num_cached_tokens for o in outs])
    assert tokens[0] == tokens[1]
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.num_blocks
    return tokens[0], cached[1]


@pytest.fixture(scope="module")
def reference(tiny_qwen3_dir: str) -> list[list[int]]:
    tokens, cached = run(tiny_qwen3_dir, enable_prefix_caching=False)
    assert cached == [0, 0, 0, 0]
    return tokens


def test_prefix_caching_hits_and_agrees(tiny_qwen3_dir: str, reference) -> None:
    tokens, cached = run(tiny_qwen3_dir, enable_prefix_caching=True)
    assert tokens == reference
    # Second round: every prompt finds its full blocks cached (at least one token recomputed).
    assert cached[0] >= 40 and cached[1] >= 40 and cached[3] == 16


@pytest.mark.parametrize(
    "options",
    [
        {"max_num_batched_tokens": 5},  # chunked prefill, mixed with decodes
        {"num_gpu_blocks_override": 20},  # preemption by recompute
        {"max_num_seqs": 1},
        {"max_num_batched_tokens": 7, "num_gpu_blocks_override": 18, "max_num_seqs": 3},
        {"async_scheduling": False},
        {"async_scheduling": False, "max_num_batched_tokens": 7, "num_gpu_blocks_override": 18},
    ],
    ids=["chunked", "preempt", "one-seat", "all", "sync", "sync-all"],
)
def test_schedules_agree(tiny_qwen3_dir: str, reference, options) -> None:
    tokens, _ = run(tiny_qwen3_dir, **options)
    assert tokens == reference
