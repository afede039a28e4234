"""Synthetic acceptance in the engine (rejection_sample_method "synthetic", vLLM's benchmark
mode): the measured mean acceptance length is the forced one, per position as the rates say,
with a draft model whose drafts the target would not sample; logprobs score the tokens kept;
the counters agree with the requests' metrics; every KV block is free afterwards."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.spec_decode.metrics import mean_acceptance_length
from minivllm.tiny_model import build_tiny_model

PROMPTS = [list(range(3 + i, 20 + 3 * i)) for i in range(4)]
MAX_TOKENS = 40


def _run(model_dir: str, spec: dict | None, max_tokens: int = MAX_TOKENS):
    params = [
        SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=1 if i % 2 else None
        )
        for i in range(len(PROMPTS))
    ]
    llm = LLM(model_dir, device="cpu", block_size=8, speculative_config=spec)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    scheduler = llm.engine.scheduler
    all_free = scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    stats = scheduler.speculator.stats if scheduler.speculator is not None else None
    llm.shutdown()
    return outs, stats, all_free


@pytest.fixture(scope="module")
def other_draft_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A draft model of the target's vocabulary with other weights: its drafts are mostly not
    the target's greedy tokens."""
    return build_tiny_model(str(tmp_path_factory.mktemp("draft")), "Qwen3ForCausalLM", seed=7)


def test_forced_acceptance_length(tiny_qwen3_dir: str, other_draft_dir: str) -> None:
    spec = {
        "method": "draft_model",
        "model": other_draft_dir,
        "num_speculative_tokens": 4,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.5,  # rates [1.0, 0.5, 0.0, 0.0]
    }
    outs, stats, all_free = _run(tiny_qwen3_dir, spec)
    assert all_free
    assert [len(o.outputs[0].token_ids) for o in outs] == [MAX_TOKENS] * len(PROMPTS)
    # Kept drafts are the draft model's, not what the target samples: the text changes.
    ref, _, _ = _run(tiny_qwen3_dir, None, max_tokens=6)
    for out, target in zip(outs, ref, strict=True):
        assert list(out.outputs[0].token_ids[:6]) != list(target.outputs[0].token_ids)
    # Draft 0 is always kept, draft 1 half the time, drafts 2 and 3 never. (A request near
    # max_tokens drafts fewer, so position 1 counts slightly fewer chances than drafts.)
    per_pos = stats.num_accepted_tokens_per_pos
    assert per_pos[0] == stats.num_drafts and per_pos[2:] == [0, 0]
    assert 0.3 < per_pos[1] / stats.num_drafts < 0.7
    assert mean_acceptance_length(stats) == pytest.approx(2.5, abs=0.2)
    assert sum(o.metrics.num_draft_tokens for o in outs) == stats.num_draft_tokens
    assert sum(o.metrics.num_accepted_tokens for o in outs) == stats.num_accepted_tokens
    for out in outs[1::2]:  # logprobs: each entry scores the token it belongs to
        completion = out.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids)
        assert all(t in e for t, e in zip(completion.token_ids, completion.logprobs, strict=True))


def test_forced_acceptance_with_ngram(tiny_qwen3_dir: str) -> None:
    # Certain drafts of the prompt lookup, kept at rates [0.5, 0, 0] whatever the target says.
    spec = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [0.5, 0.0, 0.0],
    }
    outs, stats, all_free = _run(tiny_qwen3_dir, spec)
    assert all_free and stats.num_drafts > 20
    assert stats.num_accepted_tokens_per_pos[1:] == [0, 0]
    assert mean_acceptance_length(stats) == pytest.approx(1.5, abs=0.2)
