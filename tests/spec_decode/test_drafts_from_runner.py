"""Drafts come out of the runner: the proposer (n-gram, or the draft model) runs after a step is
sampled, never inside the scheduler's schedule(), which launches no model work; under async
scheduling a step that asks for drafts stays in flight too (the next step's draft slots are
filled by the runner)."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.runner.model_runner import ModelRunner

PROMPTS = [([5, 6, 7, 8, 9] * 8)[: 10 + 3 * i] for i in range(3)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def _spec(method: str, model_dir: str) -> dict:
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                "prompt_lookup_min": 1}  # fmt: skip
    return {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 3}


def _generate(llm: LLM) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_schedule_launches_no_model_work(tiny_qwen3_dir: str, method: str, monkeypatch) -> None:
    llm = LLM(tiny_qwen3_dir, device="cpu", block_size=8,
              speculative_config=_spec(method, tiny_qwen3_dir))  # fmt: skip
    engine = llm.engine
    where: dict[str, list[bool]] = {"forward": [], "propose": []}
    in_schedule = [False]
    schedule = engine.scheduler.schedule

    def recording_schedule(*args, **kwargs):
        in_schedule[0] = True
        try:
            return schedule(*args, **kwargs)
        finally:
            in_schedule[0] = False

    def recorded(name, call):
        def wrapper(*args, **kwargs):
            where[name].append(in_schedule[0])
            return call(*args, **kwargs)

        return wrapper

    engine.scheduler.schedule = recording_schedule
    # Every model forward, the draft model's runner's included (it is a ModelRunner too).
    monkeypatch.setattr(ModelRunner, "forward", recorded("forward", ModelRunner.forward))
    proposer = engine.executor.runner.drafter.proposer
    proposer.propose = recorded("propose", proposer.propose)
    _generate(llm)
    stats = engine.scheduler.speculator.stats
    llm.shutdown()
    assert stats.num_accepted_tokens > 0
    assert where["propose"] and where["forward"]
    assert not any(where["propose"]) and not any(where["forward"])


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_async_scheduling_runs_ahead_of_drafting_steps(tiny_qwen3_dir: str, method: str) -> None:
    """Async scheduling: every step stays in flight while the next is scheduled, whether it
    asks the runner for drafts or not (here some steps have more requests than
    disable_by_batch_size): a drafting request's next step gets draft slots, filled by the
    runner at launch. The tokens are the target's own."""
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 8 * i, ignore_eos=True)
              for i in range(len(PROMPTS))]  # fmt: skip

    def generate(llm: LLM) -> list[list[int]]:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    plain = LLM(tiny_qwen3_dir, device="cpu", block_size=8)
    ref = generate(plain)
    plain.shutdown()
    spec = {**_spec(method, tiny_qwen3_dir), "disable_by_batch_size": 2}
    llm = LLM(tiny_qwen3_dir, device="cpu", block_size=8, async_scheduling=True,
              speculative_config=spec)  # fmt: skip
    scheduler = llm.engine.scheduler
    catch_up, schedule = scheduler.catch_up, scheduler.schedule
    kept: dict[bool, list[bool]] = {True: [], False: []}  # asked -> step kept in flight
    num_slot_chunks = [0]  # chunks scheduled with draft slots (placeholders)

    def recording_catch_up():
        in_flight = scheduler._in_flight
        catch_up()
        if in_flight is not None:
            asked = any(c.draft_cap for c in in_flight[0].chunks)
            kept[asked].append(scheduler._in_flight is in_flight)

    def recording_schedule(*args, **kwargs):
        sched_out = schedule(*args, **kwargs)
        num_slot_chunks[0] += sum(
            1 for c in sched_out.chunks if c.num_draft_tokens and c.token_ids[-1] < 0
        )
        return sched_out

    scheduler.catch_up, scheduler.schedule = recording_catch_up, recording_schedule
    got = generate(llm)
    stats = scheduler.speculator.stats
    all_free = scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    llm.shutdown()
    assert got == ref
    assert stats.num_accepted_tokens > 0 and all_free
    assert kept[False] and all(kept[False])  # ran ahead
    assert kept[True] and all(kept[True])  # ran ahead too: the next step took draft slots
    assert num_slot_chunks[0] > 0
