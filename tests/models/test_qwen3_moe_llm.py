"""LLM(...) on the tiny Qwen3-MoE checkpoint against HF transformers' float32 forward under
teacher forcing: every greedy token is HF's argmax and every chosen-token logprob is HF's to
1e-4, batched, one prompt at a time, with chunked prefill and with TP=2 (gloo)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM
from minivllm.engine.executor.tp_executor import check_shardable
from minivllm.models.model_config import ModelConfig
from tests.models.hf_greedy import (
    assert_batched_and_alone_match_hf,
    assert_greedy_matches_hf,
    cpu_llm,
    greedy_outputs,
)

PROMPTS = [
    [5, 17, 42, 99, 3],
    [7] * 13 + [8, 9],
    [100, 200, 300],
    list(range(20, 57)),
    [11],
    list(range(300, 250, -2)),
]
MAX_TOKENS = 10
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_moe_dir: str):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_moe_dir, dtype=torch.float32).eval()


make_llm = cpu_llm


def generate(llm: LLM, prompts: list[list[int]]) -> list:
    return greedy_outputs(llm, prompts, MAX_TOKENS)


def assert_matches_hf(hf_model, prompts: list[list[int]], completions: list) -> None:
    assert_greedy_matches_hf(hf_model, prompts, completions, MAX_TOKENS, LOGPROB_TOL)


def test_batched_and_alone_match_hf(tiny_qwen3_moe_dir: str, hf_model) -> None:
    assert_batched_and_alone_match_hf(
        make_llm(tiny_qwen3_moe_dir), hf_model, PROMPTS, MAX_TOKENS, LOGPROB_TOL
    )


def test_chunked_prefill_matches_hf(tiny_qwen3_moe_dir: str, hf_model) -> None:
    llm = make_llm(tiny_qwen3_moe_dir, max_num_batched_tokens=8, enable_prefix_caching=False)
    assert max(len(p) for p in PROMPTS) > 8  # the long prompts span several steps
    completions = generate(llm, PROMPTS)
    assert_matches_hf(hf_model, PROMPTS, completions)
    # enable_return_routed_experts is off by default (tests/models/test_routed_experts.py).
    assert all(c.routed_experts is None for c in completions)


def test_tp2_matches_hf(tiny_qwen3_moe_dir: str, hf_model) -> None:
    """Each of 2 ranks holds half of every expert's intermediate dim (and half the heads)."""
    llm = make_llm(tiny_qwen3_moe_dir, tensor_parallel_size=2)
    try:
        completions = generate(llm, PROMPTS)
    finally:
        llm.shutdown()
    assert_matches_hf(hf_model, PROMPTS, completions)


def test_tp_needs_a_divisible_expert_intermediate_dim(tiny_qwen3_moe_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_moe_dir)
    check_shardable(config, 4)
    moe = dataclasses.replace(config.moe, moe_intermediate_size=30)
    with pytest.raises(ValueError, match=r"moe_intermediate_size \(30\).*\(4\)"):
        check_shardable(dataclasses.replace(config, moe=moe), 4)
