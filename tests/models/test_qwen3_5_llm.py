"""LLM(...) on the tiny Qwen3.5 checkpoint (hybrid: Gated DeltaNet + gated attention) against HF
transformers' float32 forward under teacher forcing: every greedy token is HF's argmax and
every chosen-token logprob is HF's to 1e-4, batched, one prompt at a time, with chunked
prefill (chunk boundaries inside and across the gated delta rule's 64-token chunks), with
preemption and recompute (prefix-cache hits: test_qwen3_5_prefix_cache.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams, model_loader
from tests.models.hf_greedy import (
    assert_batched_and_alone_match_hf,
    assert_greedy_matches_hf,
    cpu_llm,
    greedy_outputs,
)

PROMPTS = [
    [5, 17, 42, 99, 3],
    [7] * 13 + [8, 9],
    list(range(20, 90)),  # 70 tokens: past one 64-token chunk
    [11],
    list(range(400, 270, -1)),  # 130 tokens: three chunks
]
MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_5_dir: str):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_5_dir, dtype=torch.float32).eval()


make_llm = cpu_llm


def generate(llm: LLM, prompts: list[list[int]]) -> list:
    return greedy_outputs(llm, prompts, MAX_TOKENS)


def assert_matches_hf(hf_model, prompts: list[list[int]], completions: list) -> None:
    assert_greedy_matches_hf(hf_model, prompts, completions, MAX_TOKENS, LOGPROB_TOL)


def test_batched_and_alone_match_hf(tiny_qwen3_5_dir: str, hf_model) -> None:
    assert_batched_and_alone_match_hf(
        make_llm(tiny_qwen3_5_dir), hf_model, PROMPTS, MAX_TOKENS, LOGPROB_TOL
    )


@pytest.mark.parametrize("max_num_batched_tokens", [24, 40])
def test_chunked_prefill_matches_hf(
    tiny_qwen3_5_dir: str, hf_model, max_num_batched_tokens: int
) -> None:
    """Chunks of 24 or 40 tokens: a chunk's state carried into the next, which starts inside
    a 64-token chunk of the rule (24, 48, ...) or straddles one (40 -> 80)."""
    llm = make_llm(tiny_qwen3_5_dir, max_num_batched_tokens=max_num_batched_tokens)
    assert_matches_hf(hf_model, PROMPTS, generate(llm, PROMPTS))


def test_preemption_matches_hf(tiny_qwen3_5_dir: str, hf_model) -> None:
    """60 blocks of 4 hold all five prompts, not their outputs: preempted requests give
    their state slot back and recompute from a fresh state."""
    llm = make_llm(tiny_qwen3_5_dir, num_gpu_blocks_override=60)
    completions = generate(llm, PROMPTS)
    assert llm.engine.stats().num_preemptions > 0
    assert_matches_hf(hf_model, PROMPTS, completions)


def test_triton_kernels_match_hf(
    tiny_qwen3_5_dir: str, hf_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's path in Triton's interpreter: the gated-delta and conv kernels (prefill over
    packed chunks with carried states, the one-token step in place) and the Triton attention
    backend, chunked prefill across a 64-token chunk."""
    monkeypatch.setattr(model_loader, "use_triton_kernels", lambda device: True)
    llm = make_llm(tiny_qwen3_5_dir, max_num_batched_tokens=40, attention_backend="triton")
    layer = llm.engine.executor.runner.model.recurrent_layers()[0]
    assert layer.use_triton
    prompts = PROMPTS[:3]
    assert_matches_hf(hf_model, prompts, generate(llm, prompts))
