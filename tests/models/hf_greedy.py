"""Greedy completions of our engine against HF's fp32 model: every token HF's argmax, every
sampled token's logprob HF's log_softmax within a tolerance (the tiny-model tests' oracle)."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams


def cpu_llm(model_dir: str, **options) -> LLM:
    """The engine the tiny-model tests run: float32 on the CPU, blocks of 4 tokens."""
    return LLM(model_dir, dtype="float32", device="cpu", block_size=4, **options)


def greedy_outputs(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list:
    """Each prompt's CompletionOutput: greedy, max_tokens tokens, the sampled token's logprob."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    requests = [{"prompt_token_ids": p} for p in prompts]
    return [o.outputs[0] for o in llm.generate(requests, params, use_tqdm=False)]


@torch.no_grad()
def assert_greedy_matches_hf(
    hf_model, prompts: list[list[int]], completions: list, max_tokens: int, tol: float = 1e-4
) -> None:
    for prompt, completion in zip(prompts, completions, strict=True):
        tokens = list(completion.token_ids)
        assert len(tokens) == max_tokens
        logits = hf_model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        logprobs = logits.log_softmax(-1)
        assert tokens == logits.argmax(-1).tolist(), f"prompt {prompt}"
        for i, token in enumerate(tokens):
            ours = completion.logprobs[i][token].logprob
            assert ours == pytest.approx(logprobs[i, token].item(), abs=tol)


def assert_batched_and_alone_match_hf(
    llm: LLM, hf_model, prompts: list[list[int]], max_tokens: int, tol: float = 1e-4
) -> None:
    """The prompts batched, then each alone: both HF's (assert_greedy_matches_hf), and the
    same tokens."""
    batched = greedy_outputs(llm, prompts, max_tokens)
    assert_greedy_matches_hf(hf_model, prompts, batched, max_tokens, tol)
    alone = [greedy_outputs(llm, [p], max_tokens)[0] for p in prompts]
    assert_greedy_matches_hf(hf_model, prompts, alone, max_tokens, tol)
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched]
