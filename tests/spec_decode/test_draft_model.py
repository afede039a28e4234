"""Speculative decoding with a draft model (engine/draft_model.py): the output is the target's
own whatever the draft proposes; a model drafting for itself has every draft accepted, another
model (other weights, same vocabulary) has many rejected; every KV block is free afterwards."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from minivllm import LLM, SamplingParams
from minivllm.tiny_model import build_tiny_model

PROMPTS = [list(range(3 + i, 20 + 3 * i)) for i in range(4)]


def _run(model_dir: str, params, spec=None, **options):
    llm = LLM(model_dir, device="cpu", block_size=8, speculative_config=spec, **options)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    scheduler = llm.engine.scheduler
    all_free = scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    stats = scheduler.speculator.stats if scheduler.speculator is not None else None
    llm.shutdown()
    return [list(o.outputs[0].token_ids) for o in outs], stats, all_free


def _spec(draft_dir: str, **kw) -> dict:
    return {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": 3, **kw}


PARAMS = [SamplingParams(temperature=0.0, max_tokens=24 + 3 * i, ignore_eos=True) for i in range(4)]


def test_self_draft_accepts_everything(tiny_qwen3_dir: str) -> None:
    ref, _, _ = _run(tiny_qwen3_dir, PARAMS)
    got, stats, all_free = _run(tiny_qwen3_dir, PARAMS, _spec(tiny_qwen3_dir))
    assert got == ref and all_free
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens


def test_other_draft_model_changes_nothing(tiny_qwen3_dir: str, tmp_path) -> None:
    other = build_tiny_model(str(tmp_path / "other"), "Qwen3ForCausalLM", seed=7)
    ref, _, _ = _run(tiny_qwen3_dir, PARAMS)
    # Few KV blocks: preemption and recompute while the draft model keeps its own KV.
    got, stats, all_free = _run(tiny_qwen3_dir, PARAMS, _spec(other), num_gpu_blocks_override=12)
    assert got == ref and all_free
    assert 0 <= stats.num_accepted_tokens < stats.num_draft_tokens


def test_seeded_sampling_same_tokens(tiny_qwen3_dir: str) -> None:
    params = [
        SamplingParams(temperature=0.05, seed=i, max_tokens=12 + 6 * i, ignore_eos=True)
        for i in range(4)
    ]
    ref, _, _ = _run(tiny_qwen3_dir, params)
    got, stats, _ = _run(tiny_qwen3_dir, params, _spec(tiny_qwen3_dir, disable_by_batch_size=2))
    assert got == ref and stats.num_accepted_tokens > 0


def test_bad_draft_models(tiny_qwen3_dir: str, tmp_path) -> None:
    other_vocab = str(tmp_path / "vocab")
    shutil.copytree(tiny_qwen3_dir, other_vocab)
    config_path = os.path.join(other_vocab, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    with open(config_path, "w") as f:
        json.dump({**config, "vocab_size": config["vocab_size"] + 64}, f)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(tiny_qwen3_dir, device="cpu", speculative_config=_spec(other_vocab))
