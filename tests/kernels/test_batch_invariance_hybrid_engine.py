"""The deterministic engine on a hybrid model (Qwen3.5; the triton backend and GEMMs in the
interpreter): the same tokens alone and batched, and with speculative decoding on and off."""

from __future__ import annotations

import pytest
from deterministic_engine import (
    PROMPTS,
    deterministic_llm,
    generate_each_alone,
    tokens_and_logprobs,
)
from deterministic_engine import generate_deterministic as _generate
from ordered_dot import ordered_dot, ordered_dot_in_workers  # noqa: F401 (fixtures)

from minivllm import SamplingParams


@pytest.mark.usefixtures("ordered_dot")
def test_deterministic_hybrid_engine_same_tokens_alone_and_batched(tiny_qwen3_5_dir: str) -> None:
    """Qwen3.5: each request's recurrent state is its own, so batching changes
    no token. On the CPU the torch one-token step's batched einsum may round a logprob's last
    bits by batch size (the Triton decode kernel runs one program per request); chunk
    boundaries do change bits (the rule's chunked form and its one-token step round apart).
    (The MoE variant's experts are invariant as Qwen3-MoE's: test_batch_invariance_engine.py;
    on the GPU, tests/gpu/test_gpu_qwen3_5_moe.py runs it deterministic.)"""
    ref = _generate(tiny_qwen3_5_dir, PROMPTS)
    alone = generate_each_alone(tiny_qwen3_5_dir, PROMPTS)
    assert [tokens for tokens, _ in alone] == [tokens for tokens, _ in ref]
    for (_, ours), (_, expected) in zip(alone, ref, strict=True):
        for entry, ref_entry in zip(ours, expected, strict=True):
            assert [t for t, _ in entry] == [t for t, _ in ref_entry]
            assert [lp for _, lp in entry] == pytest.approx([lp for _, lp in ref_entry], abs=1e-5)


@pytest.mark.usefixtures("ordered_dot")
def test_deterministic_hybrid_engine_same_tokens_with_speculative_decoding(
    repeating_qwen3_5_dir: str,
) -> None:
    """n-gram drafts (accepted, and rejected part-way) on the repetitive Qwen3.5: a verify
    step's rows run the one-token step of the Gated DeltaNet layers position by position and
    the batch-invariant decode kernels of attention, so the tokens, and their logprobs to the
    batched einsum's rounding on the CPU (above), are those of decoding one token a step."""
    # A loop of the model's own text: it drafts soon, and has a draft rejected part-way.
    prompts = [[95, 257, 69, 232, 424, 202] * 2]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 3}  # fmt: skip
    ref = _generate(repeating_qwen3_5_dir, prompts, params)
    llm = deterministic_llm(repeating_qwen3_5_dir, speculative_config=spec)
    requests = [{"prompt_token_ids": p} for p in prompts]
    drafted = tokens_and_logprobs(llm.generate(requests, params, use_tqdm=False))
    stats = llm.engine.stats()
    llm.shutdown()
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert [tokens for tokens, _ in drafted] == [tokens for tokens, _ in ref]
    for (_, ours), (_, expected) in zip(drafted, ref, strict=True):
        for entry, ref_entry in zip(ours, expected, strict=True):
            assert [t for t, _ in entry] == [t for t, _ in ref_entry]
            assert [lp for _, lp in entry] == pytest.approx([lp for _, lp in ref_entry], abs=1e-5)
