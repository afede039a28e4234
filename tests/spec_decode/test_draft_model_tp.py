"""Speculative decoding under tensor parallelism (gloo, CPU), async scheduling on: the draft
model runs whole on rank 0, beside the sharded target; drafting requests take draft slots,
which rank 0 fills before the step travels. The tokens are TP=1's without speculation, greedy
and seeded."""

from __future__ import annotations

from minivllm import LLM, SamplingParams
from minivllm.engine.runner.drafts.draft_slots import grammar_for_step

PROMPTS = [([5, 6, 7, 8, 9] * 8)[: 10 + 3 * i] for i in range(3)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
# Seeded draws: a worker that sampled a step before reading the one before it (whose rejected
# drafts give their draws back) would draw other tokens than rank 0.
SEEDED = [GREEDY, SamplingParams(temperature=0.9, seed=7, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=0.9, seed=3, max_tokens=12, ignore_eos=True)]  # fmt: skip
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}  # fmt: skip


def _run(model_dir: str, tp: int, spec: dict | None, params) -> tuple[list[list[int]], int, int]:
    """Each prompt's tokens, the accepted drafts (0 without speculation) and the chunks
    scheduled with draft slots."""
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4, tensor_parallel_size=tp,
              speculative_config=spec)  # fmt: skip
    scheduler = llm.engine.scheduler
    schedule, num_slot_chunks = scheduler.schedule, [0]

    def counting_schedule(*args, **kwargs):
        sched_out = schedule(*args, **kwargs)
        num_slot_chunks[0] += sum(
            1 for c in sched_out.chunks if c.num_draft_tokens and c.token_ids[-1] < 0
        )
        return sched_out

    scheduler.schedule = counting_schedule
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        speculator = scheduler.speculator
        accepted = 0 if speculator is None else speculator.stats.num_accepted_tokens
        if tp > 1:  # no rank failed a step that rank 0 ran (its error would go unseen)
            assert llm.engine.executor._num_step_errors() == 0
        if spec is not None and spec["method"] == "draft_model" and tp > 1:
            draft = llm.engine.executor.runner.drafter.proposer.runner
            assert draft.model.model.layers[0].self_attn.qkv_proj.tp_size == 1  # whole
        return [list(o.outputs[0].token_ids) for o in outs], accepted, num_slot_chunks[0]
    finally:
        llm.shutdown()


def test_draft_model_tp2_matches_tp1(tiny_qwen3_dir: str) -> None:
    spec = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 3}
    ref, _, _ = _run(tiny_qwen3_dir, 1, None, GREEDY)
    tp1, accepted_tp1, _ = _run(tiny_qwen3_dir, 1, spec, GREEDY)
    tp2, accepted_tp2, num_slot_chunks = _run(tiny_qwen3_dir, 2, spec, GREEDY)
    assert tp1 == ref and tp2 == ref
    # The draft is the target itself: every draft is accepted, at either TP size.
    assert accepted_tp1 > 0 and accepted_tp2 == accepted_tp1
    assert num_slot_chunks > 0


def test_ngram_draft_slots_tp2_seeded(tiny_qwen3_dir: str) -> None:
    ref, _, _ = _run(tiny_qwen3_dir, 1, None, SEEDED)
    got, accepted, num_slot_chunks = _run(tiny_qwen3_dir, 2, NGRAM, SEEDED)
    assert got == ref
    assert accepted > 0 and num_slot_chunks > 0


def test_constrained_row_after_emptied_slots_tp2(tiny_qwen3_dir: str, monkeypatch) -> None:
    """A regex-constrained request batched after drafting ones at TP=2: where a drafting
    request's slots were left partly empty (fewer proposals than slots), the mask rows the
    other ranks get are the filled step's, as rank 0's are. Same tokens as TP=1 without
    speculation."""
    from minivllm.engine.executor import tp_executor
    from minivllm.structured_output.params import StructuredOutputsParams

    moved = [0]  # steps whose mask rows were moved for the other ranks

    def counting(grammar, row_map):
        moved[0] += row_map is not None
        return grammar_for_step(grammar, row_map)

    monkeypatch.setattr(tp_executor, "grammar_for_step", counting)
    regex = StructuredOutputsParams(regex=r"[0-9]{6}-[a-c]{4}")
    params = [GREEDY, GREEDY, SamplingParams(temperature=0.0, max_tokens=40,
                                             structured_outputs=regex)]  # fmt: skip
    ref, _, _ = _run(tiny_qwen3_dir, 1, None, params)
    got, accepted, num_slot_chunks = _run(tiny_qwen3_dir, 2, NGRAM, params)
    assert got == ref
    assert accepted > 0 and num_slot_chunks > 0 and moved[0] > 0
