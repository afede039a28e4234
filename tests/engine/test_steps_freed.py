"""A busy engine keeps only the step in flight alive: no step's objects (its chunks, handles,
mask) may reach back to the steps before it, or a busy engine would hold every step since it
last went idle, and the cyclic GC would walk them all at each collection."""

from __future__ import annotations

import weakref

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.engine_core import EngineCore
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.structured_output import StructuredOutputsParams

_REGEX = StructuredOutputsParams(regex="[a-z ]+")
KINDS = {
    "plain": ({}, {}),
    "constrained": ({}, {"structured_outputs": _REGEX}),
    "logprobs": ({}, {"logprobs": 2}),
    "prompt_logprobs": ({}, {"prompt_logprobs": 1}),
    "ngram": ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}, {}),
    "draft_model": ({"speculative_config": "draft_model"}, {}),  # the model drafts for itself
    # The masks are filled once the step in flight is applied (AsyncScheduler.grammar_output).
    "constrained_tp2": ({"tensor_parallel_size": 2}, {"structured_outputs": _REGEX}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_busy_engine_keeps_only_the_step_in_flight(
    tiny_qwen3_dir: str, kind: str, monkeypatch
) -> None:
    engine_options, params = KINDS[kind]
    if engine_options.get("speculative_config") == "draft_model":
        draft = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 3}
        engine_options = {"speculative_config": draft}
    steps: list[weakref.ref] = []
    most_alive = 0
    schedule, step = Scheduler.schedule, EngineCore.step

    def keep_schedule(self, *args, **kwargs):
        sched_out = schedule(self, *args, **kwargs)
        steps.append(weakref.ref(sched_out))
        return sched_out

    def count_step(self):
        nonlocal most_alive
        outputs = step(self)
        most_alive = max(most_alive, sum(ref() is not None for ref in steps))
        return outputs

    monkeypatch.setattr(Scheduler, "schedule", keep_schedule)
    monkeypatch.setattr(EngineCore, "step", count_step)
    llm = LLM(tiny_qwen3_dir, device="cpu", **engine_options)
    try:
        prompts = [{"prompt_token_ids": [3 + i, 4, 5, 6] * 3} for i in range(8)]
        sampling = SamplingParams(max_tokens=40, ignore_eos=True, **params)
        llm.generate(prompts, sampling, use_tqdm=False)
    finally:
        llm.shutdown()
    assert len(steps) > 20
    # Freed by their reference counts between steps (no collection was asked for): the step
    # in flight, and the one just scheduled while it ran.
    assert most_alive <= 2, (most_alive, len(steps))
