"""Jump-forward: the tokens a grammar forces (JSON keys, punctuation) go in as drafts, each
verified under its own position's mask, several per step; the output (tokens, logprobs, seeded
draws) is what decoding them one by one gives, and every KV block is free afterwards."""

from __future__ import annotations

import re

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.sched import scheduler as scheduler_module
from minivllm.structured_output.params import StructuredOutputsParams

# Long literal runs (forced) between short free parts.
GRAMMAR = r"""
start: "{\"alpha_key\": " NUM ", \"beta_value_key\": \"" WORD "\", \"gamma\": [" NUM "]}"
NUM: /[0-9]{1,3}/
WORD: "xx" | "yy"
"""
PATTERN = r'\{"alpha_key": [0-9]{1,3}, "beta_value_key": "(xx|yy)", "gamma": \[[0-9]{1,3}\]\}'
PROMPTS = [list(range(3 + i, 20 + i)) for i in range(4)]
FORCED_DRAFTS = scheduler_module.forced_drafts


def _run(
    model_dir: str,
    jump_forward: bool,
    monkeypatch: pytest.MonkeyPatch,
    logprobs: int | None = 1,
    after_pending: list[int] | None = None,
    **options,
):
    """after_pending: collects the number of forced drafts scheduled after a token in flight."""
    forced = []

    def counting(requests, max_model_len):
        out = FORCED_DRAFTS(requests, max_model_len) if jump_forward else {}
        forced.extend(len(d) for d in out.values())
        if after_pending is not None:
            pending = {r.req_id for r in requests if r.num_pending_tokens}
            after_pending.extend(len(d) for req_id, d in out.items() if req_id in pending)
        return out

    monkeypatch.setattr(scheduler_module, "forced_drafts", counting)
    params = [
        SamplingParams(
            temperature=0.0 if i % 2 else 0.8,
            seed=i,
            max_tokens=80,
            logprobs=logprobs,
            structured_outputs=StructuredOutputsParams(grammar=GRAMMAR),
        )
        for i in range(len(PROMPTS))
    ]
    llm = LLM(model_dir, device="cpu", block_size=8, **options)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    block_manager = llm.engine.scheduler.block_manager
    all_free = block_manager.num_free_blocks == block_manager.num_blocks
    num_preemptions = llm.engine.scheduler.num_preemptions
    llm.shutdown()
    results = [
        (
            list(o.outputs[0].token_ids),
            [sorted((t, lp.logprob) for t, lp in e.items()) for e in o.outputs[0].logprobs or []],
            o.outputs[0].text,
            o.outputs[0].finish_reason,
        )
        for o in outs
    ]
    return results, sum(forced), all_free, num_preemptions


@pytest.mark.parametrize("options", [{}, {"num_gpu_blocks_override": 16}])
def test_same_output_with_and_without(tiny_qwen3_dir, monkeypatch, options) -> None:
    ref, none, *_ = _run(tiny_qwen3_dir, False, monkeypatch, **options)
    got, num_forced, all_free, _ = _run(tiny_qwen3_dir, True, monkeypatch, **options)
    assert none == 0 and num_forced > 0 and all_free
    assert [r[0] for r in got] == [r[0] for r in ref]
    # Logprobs to float rounding: a verify step's logits may differ from a decode step's in the
    # last bits outside deterministic mode (preemption moves them too).
    for (_, got_lp, *_), (_, ref_lp, *_) in zip(got, ref, strict=True):
        assert [[t for t, _ in e] for e in got_lp] == [[t for t, _ in e] for e in ref_lp]
        got_values = [v for e in got_lp for _, v in e]
        assert got_values == pytest.approx([v for e in ref_lp for _, v in e], abs=1e-4)
    for _, _, text, finish_reason in got:
        assert finish_reason == "stop" and re.fullmatch(PATTERN, text), text


@pytest.mark.parametrize("options", [{}, {"num_gpu_blocks_override": 16}])
def test_async_scheduling_drafts_after_the_token_in_flight(
    tiny_qwen3_dir, monkeypatch, options
) -> None:
    """Without logprobs a constrained step is scheduled while the step before it runs: its
    forced drafts follow the token in flight (the grammar's guess of it), a step with drafts
    in flight does not stop the next from being scheduled ahead (the drafted request sits it
    out, or is preempted meanwhile), and the output is still what decoding token by token,
    synchronously, gives."""
    ref, *_ = _run(tiny_qwen3_dir, False, monkeypatch, None, async_scheduling=False)
    after_pending: list[int] = []
    got, num_forced, all_free, num_preemptions = _run(
        tiny_qwen3_dir, True, monkeypatch, None, after_pending, async_scheduling=True, **options
    )
    assert num_forced > 0 and sum(after_pending) > 0 and all_free
    assert bool(num_preemptions) == bool(options)
    assert [r[0] for r in got] == [r[0] for r in ref]
    for _, _, text, finish_reason in got:
        assert finish_reason == "stop" and re.fullmatch(PATTERN, text), text


def test_penalized_request_beside_forced_drafts(tiny_qwen3_dir) -> None:
    """Async scheduling runs ahead of a step with a grammar's forced drafts: a penalized
    request without drafts in it is sampled again before that step is read, so the step
    counts its token in the penalty tables on the device, as a plain step does."""
    penalized = SamplingParams(
        temperature=0.0, max_tokens=40, ignore_eos=True, repetition_penalty=1.5,
        frequency_penalty=0.5,
    )  # fmt: skip
    constrained = SamplingParams(
        temperature=0.0, max_tokens=80, structured_outputs=StructuredOutputsParams(grammar=GRAMMAR)
    )
    llm = LLM(tiny_qwen3_dir, device="cpu", block_size=8, async_scheduling=True)
    alone = llm.generate([{"prompt_token_ids": PROMPTS[1]}], penalized, use_tqdm=False)
    both = llm.generate(
        [{"prompt_token_ids": PROMPTS[0]}, {"prompt_token_ids": PROMPTS[1]}],
        [constrained, penalized],
        use_tqdm=False,
    )
    llm.shutdown()
    assert re.fullmatch(PATTERN, both[0].outputs[0].text)
    assert both[1].outputs[0].token_ids == alone[0].outputs[0].token_ids


def test_hybrid_models_take_forced_drafts_with_draft_state_slots(
    tiny_qwen3_5_dir, monkeypatch
) -> None:
    """A hybrid model (Qwen3.5) with speculative decoding has draft-state slots for the recurrent
    states after each draft: its grammar's forced tokens go in as drafts too, and the output
    is what decoding them one by one gives."""
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    options = {"dtype": "float32", "speculative_config": spec}
    ref, none, *_ = _run(tiny_qwen3_5_dir, False, monkeypatch, **options)
    got, num_forced, all_free, _ = _run(tiny_qwen3_5_dir, True, monkeypatch, **options)
    assert none == 0 and num_forced > 0 and all_free
    assert [r[0] for r in got] == [r[0] for r in ref]
    for _, _, text, finish_reason in got:
        assert finish_reason == "stop" and re.fullmatch(PATTERN, text), text


def test_hybrid_models_take_no_forced_drafts(tmp_path, monkeypatch) -> None:
    """A hybrid model (Qwen3.5) without speculative decoding has no draft-state slots (a recurrent
    state advanced over a rejected draft is kept only in one): it decodes its grammar's
    forced tokens one a step, no forced drafts are scheduled, and constrained requests
    finish as the grammar says (they crashed the runner before)."""
    from minivllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(str(tmp_path / "qwen3_5"), "Qwen3_5ForCausalLM")
    forced: list[int] = []

    def counting(requests, max_model_len):
        out = FORCED_DRAFTS(requests, max_model_len)
        forced.extend(len(d) for d in out.values())
        return out

    monkeypatch.setattr(scheduler_module, "forced_drafts", counting)
    params = SamplingParams(
        temperature=0.0, max_tokens=80, structured_outputs=StructuredOutputsParams(grammar=GRAMMAR)
    )
    llm = LLM(model_dir, device="cpu", block_size=8, dtype="float32")
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert forced == []
    for o in outs:
        assert o.outputs[0].finish_reason == "stop"
        assert re.fullmatch(PATTERN, o.outputs[0].text), o.outputs[0].text
