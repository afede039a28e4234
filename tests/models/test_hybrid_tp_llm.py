"""The hybrid models under tensor parallelism (TP=2 on gloo): each rank holds half of every
Gated DeltaNet layer's heads and their recurrent states, half the attention heads, and half of
every MLP's, expert's and shared expert's intermediate dim. On the tiny Qwen3.5, Qwen3.5-MoE
and Qwen3-Next, greedy tokens are HF's float32 argmax and their logprobs HF's to 1e-4: batched,
then each prompt alone, with chunks that end inside and across the rule's 64-token chunks,
then the next turn of a chat, which hits the prefix cache (every rank restores its heads'
states from the snapshot); with preemption on Qwen3-Next; and TP=1's on Qwen3.5."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import SamplingParams
from minivllm.engine.executor.tp_executor import check_shardable
from minivllm.models.model_config import ModelConfig
from tests.models.hf_greedy import assert_greedy_matches_hf, cpu_llm, greedy_outputs

PROMPTS = [
    [5, 17, 42, 99, 3],
    list(range(20, 90)),  # 70 tokens: past one 64-token chunk of the rule
    [7] * 13 + [8, 9],
]
MAX_TOKENS = 6
# Chunks of 40 tokens: the long prompt's second chunk starts inside a 64-token chunk of the
# rule and ends past it (40 -> 70).
CHUNK_TOKENS = 40
LOGPROB_TOL = 1e-4


class Session(NamedTuple):
    prompts: list[list[int]]
    completions: list  # CompletionOutput, one per prompt
    cached: int  # the chat turn's cached tokens
    num_preemptions: int


def session(model_dir: str, tp: int, **options) -> Session:
    """PROMPTS batched, then each alone, then a chat's next turn: PROMPTS[1], its answer and a
    new message."""
    llm = cpu_llm(
        model_dir, tensor_parallel_size=tp, max_num_batched_tokens=CHUNK_TOKENS, **options
    )
    try:
        completions = greedy_outputs(llm, PROMPTS, MAX_TOKENS)
        completions += [greedy_outputs(llm, [p], MAX_TOKENS)[0] for p in PROMPTS]
        turn = PROMPTS[1] + list(completions[1].token_ids) + [8, 9, 10, 11, 12]
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
        hit = llm.generate([{"prompt_token_ids": turn}], params, use_tqdm=False)[0]
        prompts = [*PROMPTS, *PROMPTS, turn]
        return Session(
            prompts, [*completions, hit.outputs[0]], hit.num_cached_tokens,
            llm.engine.stats().num_preemptions,
        )  # fmt: skip
    finally:
        llm.shutdown()


def assert_tp2_matches_hf(model_dir: str, **options) -> Session:
    """The TP=2 session, its completions checked against HF's; the chat's turn hits at the last
    block boundary of what the turn before computed (70 prompt and 5 answer tokens)."""
    split = session(model_dir, 2, **options)
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert_greedy_matches_hf(hf_model, split.prompts, split.completions, MAX_TOKENS, LOGPROB_TOL)
    assert split.cached == 72
    return split


def test_qwen3_5_tp2_matches_hf_and_tp1(tiny_qwen3_5_dir: str) -> None:
    split = assert_tp2_matches_hf(tiny_qwen3_5_dir)
    whole = session(tiny_qwen3_5_dir, 1)
    assert whole.cached == 72
    for a, b in zip(split.completions, whole.completions, strict=True):
        assert a.token_ids == b.token_ids
        for mine, other in zip(a.logprobs, b.logprobs, strict=True):
            for token, logprob in mine.items():
                assert logprob.logprob == pytest.approx(other[token].logprob, abs=LOGPROB_TOL)


def test_qwen3_5_moe_tp2_matches_hf(tiny_qwen3_5_moe_dir: str) -> None:
    """The routed experts and the shared expert split by intermediate dim."""
    assert_tp2_matches_hf(tiny_qwen3_5_moe_dir)


def test_qwen3_next_tp2_preempted_matches_hf(tiny_qwen3_next_dir: str) -> None:
    """Its fused in-projections split into Qwen3.5's at load, then by head over the ranks; 26
    blocks of 4 preempt the batch (a preempted request's state starts again on every rank)."""
    split = assert_tp2_matches_hf(tiny_qwen3_next_dir, num_gpu_blocks_override=26)
    assert split.num_preemptions > 0


def test_tp_needs_divisible_linear_attention_heads(tiny_qwen3_next_dir: str) -> None:
    """Whole Gated DeltaNet heads a rank; the shared expert split as the routed ones."""
    config = ModelConfig.from_hf(tiny_qwen3_next_dir)
    check_shardable(config, 2)
    with pytest.raises(ValueError, match=r"linear_num_key_heads \(2\).*\(4\)"):
        check_shardable(config, 4)
    moe = dataclasses.replace(config.moe, shared_expert_intermediate_size=50)
    with pytest.raises(ValueError, match=r"shared_expert_intermediate_size \(50\).*\(4\)"):
        check_shardable(dataclasses.replace(config, moe=moe, linear_attention=None), 4)
