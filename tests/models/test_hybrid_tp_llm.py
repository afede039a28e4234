"""The hybrid models under tensor parallelism (TP=2 on gloo): each rank holds half of every
Gated DeltaNet layer's heads and their recurrent states, half the attention heads, and half of
every MLP's, expert's and shared expert's intermediate dim. On the tiny Qwen3.5, Qwen3.5-MoE
and Qwen3-Next, greedy tokens are HF's float32 argmax and their logprobs HF's to 1e-4 and TP=1's:
batched, then each prompt alone, with chunks that end inside and across the rule's 64-token
chunks, then the next turn of a chat, which hits the prefix cache (every rank restores its
heads' states from the snapshot). TP=1's tokens and logprobs on Qwen3.5 too."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from tests.models.hf_greedy import assert_greedy_matches_hf, cpu_llm, greedy_outputs

PROMPTS = [
    [5, 17, 42, 99, 3],
    list(range(20, 90)),  # 70 tokens: past one 64-token chunk of the rule
    list(range(400, 270, -1)),  # 130 tokens: three
]
MAX_TOKENS = 6
# Chunks of 40 tokens: a prompt's second chunk starts inside a 64-token chunk of the rule and
# ends past it (40 -> 80).
CHUNK_TOKENS = 40
LOGPROB_TOL = 1e-4


def session(model_dir: str, tp: int) -> tuple[list[list[int]], list, list[int]]:
    """PROMPTS batched, then each alone, then a chat: PROMPTS[1] and its answer plus a new
    message. Returns (the prompts, their completions, the chat turns' cached tokens)."""
    llm = cpu_llm(model_dir, tensor_parallel_size=tp, max_num_batched_tokens=CHUNK_TOKENS)
    try:
        prompts = list(PROMPTS) + PROMPTS
        completions = greedy_outputs(llm, PROMPTS, MAX_TOKENS)
        completions += [greedy_outputs(llm, [p], MAX_TOKENS)[0] for p in PROMPTS]
        turn = PROMPTS[1] + list(completions[1].token_ids) + [8, 9, 10, 11, 12]
        prompts.append(turn)
        outputs = generate(llm, [turn])
        completions.append(outputs[0].outputs[0])
        return prompts, completions, [o.num_cached_tokens for o in outputs]
    finally:
        llm.shutdown()


def generate(llm: LLM, prompts: list[list[int]]) -> list:
    """The RequestOutputs of greedy_outputs' requests (their cached-token counts)."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def assert_tp2_matches_hf(model_dir: str) -> list:
    """The TP=2 session's completions, checked against HF's; the chat's turn hit the cache at
    the last block boundary of what the turn before computed (70 prompt and 5 answer tokens)."""
    prompts, completions, cached = session(model_dir, 2)
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert_greedy_matches_hf(hf_model, prompts, completions, MAX_TOKENS, LOGPROB_TOL)
    assert cached == [72]
    return completions


def test_qwen3_5_tp2_matches_hf_and_tp1(tiny_qwen3_5_dir: str) -> None:
    split = assert_tp2_matches_hf(tiny_qwen3_5_dir)
    _, whole, cached = session(tiny_qwen3_5_dir, 1)
    assert cached == [72]
    for a, b in zip(split, whole, strict=True):
        assert a.token_ids == b.token_ids
        for mine, other in zip(a.logprobs, b.logprobs, strict=True):
            for token, logprob in mine.items():
                assert logprob.logprob == pytest.approx(other[token].logprob, abs=LOGPROB_TOL)


def test_qwen3_5_moe_tp2_matches_hf(tiny_qwen3_5_moe_dir: str) -> None:
    """The routed experts and the shared expert split by intermediate dim."""
    assert_tp2_matches_hf(tiny_qwen3_5_moe_dir)


def test_qwen3_next_tp2_matches_hf(tiny_qwen3_next_dir: str) -> None:
    """Its fused in-projections split into Qwen3.5's at load, then by head over the ranks."""
    assert_tp2_matches_hf(tiny_qwen3_next_dir)
