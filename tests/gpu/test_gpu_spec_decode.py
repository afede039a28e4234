"""GPU, bf16, Qwen3-0.6B shape: speculative decoding (ngram, draft model) with CUDA graphs and
keyed sampling, under async scheduling (draft slots) unless a test says otherwise.
Deterministic mode: the same bits with it on and off, greedy and seeded, logprobs included;
default mode: the same greedy tokens on sharp logits."""

from __future__ import annotations

import gc

import pytest
import torch

from minivllm import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
# Prompts that repeat themselves, so that drafts are found; the sharp random logits make the
# model repeat too.
PROMPTS = [([11, 12, 13, 14, 15, 16] * 20)[: 40 + 9 * i] for i in range(6)]


def _run(model_dir: str, params, spec=None, **options):
    llm = LLM(
        model_dir,
        dtype="bfloat16",
        gpu_memory_utilization=0.3,
        max_model_len=1024,
        speculative_config=spec,
        **options,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    scheduler = llm.engine.scheduler
    stats = scheduler.speculator.stats if scheduler.speculator is not None else None
    all_free = scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    results = [
        (
            list(o.outputs[0].token_ids),
            [sorted((t, lp.logprob) for t, lp in e.items()) for e in o.outputs[0].logprobs or []],
        )
        for o in outs
    ]
    return results, stats, all_free


@pytest.mark.parametrize("seeded", [False, True])
def test_deterministic_bit_identical(model_dir: str, seeded: bool) -> None:
    params = [
        SamplingParams(
            temperature=0.7 if seeded else 0.0,
            seed=i if seeded else None,
            max_tokens=64,
            ignore_eos=True,
            logprobs=2 if i % 2 else None,
        )
        for i in range(len(PROMPTS))
    ]
    ref, _, _ = _run(model_dir, params, deterministic=True)
    got, stats, all_free = _run(model_dir, params, spec=NGRAM, deterministic=True)
    assert got == ref
    assert stats.num_accepted_tokens > 0 and all_free


def test_default_mode_greedy_tokens(model_dir: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    ref, _, _ = _run(model_dir, params)
    got, stats, all_free = _run(model_dir, params, spec=NGRAM)
    same = sum(a[0] == b[0] for a, b in zip(got, ref, strict=True))
    assert same >= len(PROMPTS) - 1  # bf16 near-ties may flip one
    assert stats.num_accepted_tokens > 0 and all_free


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_draft_model_drafting_for_itself(model_dir: str, async_scheduling: bool) -> None:
    """The target as its own draft model (built beside it, CUDA graphs): every draft accepted
    in deterministic mode, the same bits as without speculation; under async scheduling the
    draft model runs when the next step's draft slots are filled."""
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=1)
    spec = {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 3}
    options = {"deterministic": True, "async_scheduling": async_scheduling}
    ref, _, _ = _run(model_dir, params, **options)
    got, stats, all_free = _run(model_dir, params, spec=spec, **options)
    assert got == ref and all_free
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
