"""Greedy decoding on real weights against HF transformers under teacher forcing: HF's fp32
forward over prompt + our tokens must put its argmax on each of our tokens (where its top-2
gap exceeds 1e-4) and give our chosen-token logprobs to within 1e-4."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.real_model.conftest import KV_CACHE_MEMORY

CHAT_PROMPTS = ["Write a haiku about the sea.", "Give me three tips for learning Python."]
PLAIN_PROMPTS = ["Hello, my name is", "def fibonacci(n):"]
MAX_TOKENS = 32
TIE_GAP = 1e-4
LOGPROB_TOL = 1e-4
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)


def prompt_token_ids(tokenizer) -> list[list[int]]:
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        for text in CHAT_PROMPTS
    ]
    chats = [list(c["input_ids"] if hasattr(c, "keys") else c) for c in chats]
    return chats + [tokenizer.encode(text) for text in PLAIN_PROMPTS]


@torch.no_grad()
def assert_matches_hf(hf_model, prompt: list[int], completion) -> int:
    """Checks one greedy completion against HF; returns how many positions were near-ties."""
    tokens = list(completion.token_ids)
    assert len(tokens) == MAX_TOKENS
    ids = torch.tensor([prompt + tokens])
    logits = hf_model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = logits.log_softmax(-1)
    top2 = logits.topk(2, dim=-1)
    num_ties = 0
    for i, token in enumerate(tokens):
        if top2.values[i, 0] - top2.values[i, 1] > TIE_GAP:
            assert token == top2.indices[i, 0].item(), f"position {i}: {tokens}"
        else:
            num_ties += 1
        ours = completion.logprobs[i][token].logprob
        assert ours == pytest.approx(logprobs[i, token].item(), abs=LOGPROB_TOL), f"position {i}"
    return num_ties


def check_all(hf_model, prompts: list[list[int]], outputs) -> None:
    num_ties = sum(
        assert_matches_hf(hf_model, p, o.outputs[0]) for p, o in zip(prompts, outputs, strict=True)
    )
    # Real weights rarely tie: the check must have bitten almost everywhere.
    assert num_ties <= len(prompts)


@pytest.fixture(scope="module")
def prompts(gguf_llm) -> list[list[int]]:
    return prompt_token_ids(gguf_llm.tokenizer)


@pytest.fixture(scope="module")
def batched(gguf_llm, prompts) -> list:
    return gguf_llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)


def test_batched_greedy_matches_hf(batched, prompts, hf_model) -> None:
    check_all(hf_model, prompts, batched)


@pytest.mark.usefixtures("batched")  # the batched run fills the prefix cache first
def test_alone_and_prefix_hit_match_hf(gguf_llm, prompts, hf_model) -> None:
    alone = [gguf_llm.generate({"prompt_token_ids": p}, GREEDY, use_tqdm=False)[0] for p in prompts]
    check_all(hf_model, prompts, alone)
    # The chat prompts share the system prompt (and were all seen batched): 16-token blocks hit.
    assert all(o.num_cached_tokens >= 16 for o in alone[: len(CHAT_PROMPTS)])


def test_chunked_prefill_matches_hf(converted_dir, hf_model) -> None:
    llm = LLM(
        converted_dir,
        dtype="float32",
        device="cpu",
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        kv_cache_memory=KV_CACHE_MEMORY,
    )
    prompts = prompt_token_ids(llm.tokenizer)
    assert min(len(p) for p in prompts[: len(CHAT_PROMPTS)]) > 16  # so prefill spans several steps
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    llm.shutdown()
    check_all(hf_model, prompts, outputs)


def test_gguf_and_converted_directory_agree(batched, prompts, converted_dir) -> None:
    llm = LLM(converted_dir, dtype="float32", device="cpu", kv_cache_memory=KV_CACHE_MEMORY)
    assert prompt_token_ids(llm.tokenizer) == prompts  # same tokenizer and chat template
    got = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    llm.shutdown()
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in batched]


def test_real_model_answers_in_english(gguf_llm) -> None:
    out = gguf_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0.0, max_tokens=24),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.text == "The capital of France is Paris."
    assert out.finish_reason == "stop"  # on <|im_end|>, the GGUF's EOS
