"""A constrained step under async scheduling: its forward is launched, then the step in flight
is applied and the mask filled while the forward runs, then the logits are sampled
(EngineCore.run_step). The tokens are those of synchronous steps, also when a request is
aborted or ends while a step is in flight."""

from __future__ import annotations

import json
import time

import jsonschema

from minivllm import LLM, SamplingParams
from minivllm.engine.engine_core import IDLE_GRAMMAR_WAIT_S
from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import EngineRequest
from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.llguidance_backend import LLGuidanceBackend

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["ok", "n"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}


def constrained(seed: int, max_tokens: int = 40, **kwargs) -> SamplingParams:
    return SamplingParams(
        temperature=1.0,
        seed=seed,
        max_tokens=max_tokens,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
        **kwargs,
    )


def run(engine, requests: list[EngineRequest], abort_at: dict[int, str] | None = None):
    """Steps the engine core until it is idle; abort_at: step number -> req_id aborted
    before that step (the core reports nothing more of it: the frontend ends it). Returns
    req_id -> (token ids, finish reason)."""
    engine.add_requests(requests)
    tokens: dict[str, list[int]] = {r.req_id: [] for r in requests}
    finished = {}
    num_steps = 0
    while engine.has_unfinished_requests():
        num_steps += 1
        aborted = (abort_at or {}).get(num_steps)
        if aborted is not None and aborted not in finished:
            engine.abort_requests([aborted])
            finished[aborted] = "abort"
        for out in engine.step():
            tokens[out.req_id] += out.new_token_ids
            if out.finished:
                finished[out.req_id] = out.finish_reason
    return {req_id: (tokens[req_id], finished[req_id]) for req_id in tokens}


def test_the_mask_is_filled_while_the_forward_runs(llm: LLM, monkeypatch) -> None:
    """Each constrained step, in order: schedule, its forward launched, the step in flight
    applied (its tokens advance the matchers), the mask filled, the logits sampled."""
    events: list[str] = []

    def record(name, method):
        def wrapped(self, *args, **kwargs):
            events.append(name)
            return method(self, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(Scheduler, "schedule", record("schedule", Scheduler.schedule))
    monkeypatch.setattr(ModelRunner, "run_model", record("forward", ModelRunner.run_model))
    monkeypatch.setattr(Scheduler, "_apply", record("apply", Scheduler._apply))
    manager = llm.engine.structured_outputs
    monkeypatch.setattr(manager, "fill", record("fill", type(manager).fill).__get__(manager))
    monkeypatch.setattr(ModelRunner, "sample", record("sample", ModelRunner.sample))
    # A regex that forces nothing (forced tokens are drafts, which schedule after the step).
    params = SamplingParams(
        temperature=1.0,
        seed=1,
        max_tokens=6,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(regex="[a-z ]+"),
    )
    llm.generate(["hello there"], params, use_tqdm=False)
    forwards = [i for i, e in enumerate(events) if e == "forward"]
    assert len(forwards) >= 3
    for n, start in enumerate(forwards):
        step = events[start : forwards[n + 1] if n + 1 < len(forwards) else None]
        assert step[0] == "forward" and "schedule" in events[start - 1 : start], events
        assert step.index("fill") < step.index("sample"), events
        if n:  # the step before, in flight, is applied before the fill
            assert "apply" in step[: step.index("fill")], events


def test_aborts_between_launch_and_sampling_lose_nothing(llm: LLM, sync_llm: LLM) -> None:
    prompt = [5, 9, 13, 17, 21]

    def requests():
        return [EngineRequest(f"r{i}", prompt, constrained(seed=i), 0.0) for i in range(4)]

    expected = run(sync_llm.engine, requests())
    got = run(llm.engine, requests(), abort_at={3: "r1", 6: "r2"})
    assert got["r1"][1] == "abort" and got["r2"][1] == "abort"
    for req_id in ("r0", "r3"):
        assert got[req_id] == expected[req_id]
    # The aborted ones stopped partway along the same tokens.
    for req_id in ("r1", "r2"):
        assert got[req_id][0] == expected[req_id][0][: len(got[req_id][0])]
    tokenizer = llm.get_tokenizer()
    for req_id in ("r0", "r3"):
        assert expected[req_id][1] == "stop"
        text = tokenizer.decode(expected[req_id][0])
        jsonschema.validate(json.loads(text), {k: v for k, v in SCHEMA.items() if k[0] != "x"})
    assert llm.engine.stats().num_free_blocks == llm.engine.num_blocks


def test_stop_strings_and_logprobs_end_requests_as_sync_steps_do(llm: LLM, sync_llm: LLM) -> None:
    """Requests that read tokens on the host (logprobs) and end on a stop string between a
    deferred launch and its sampling."""
    params = [
        constrained(seed=3, stop=['"n"']),
        constrained(seed=4, logprobs=2),
        constrained(seed=5),
    ]
    prompts = ["hello there", "a b c", "the quick brown fox"]
    outs = {
        name: [o.outputs[0] for o in engine.generate(prompts, params, use_tqdm=False)]
        for name, engine in (("async", llm), ("sync", sync_llm))
    }
    for a, s in zip(outs["async"], outs["sync"], strict=True):
        assert a.token_ids == s.token_ids and a.finish_reason == s.finish_reason
    assert outs["async"][0].finish_reason == "stop" and '"n"' not in outs["async"][0].text
    assert [list(e) for e in outs["async"][1].logprobs] == [
        list(e) for e in outs["sync"][1].logprobs
    ]


def test_an_engine_whose_requests_all_wait_for_a_grammar_waits_instead_of_spinning(
    llm: LLM, monkeypatch
) -> None:
    """While its only request's grammar compiles, a step finds nothing to run: the engine
    waits for the compile (briefly) instead of stepping again at once. A loop of empty
    steps held the GIL that the compile and the grammar backend's first build need (in a
    server's engine process, the first constrained requests waited ~a minute)."""
    compile_s = 0.4
    compile = LLGuidanceBackend.compile

    def slow_compile(self, spec):
        time.sleep(compile_s)
        return compile(self, spec)

    monkeypatch.setattr(LLGuidanceBackend, "compile", slow_compile)
    params = SamplingParams(
        max_tokens=3,
        structured_outputs=StructuredOutputsParams(regex="[a-z]{2} compiled slowly"),
    )
    engine = llm.engine
    engine.add_requests([EngineRequest("slow", [5, 9, 13], params, 0.0)])
    start = time.perf_counter()
    num_steps, tokens = 0, []
    while engine.has_unfinished_requests():
        num_steps += 1
        for out in engine.step():
            tokens += out.new_token_ids
    assert time.perf_counter() - start >= compile_s
    assert len(tokens) == 3
    # ~compile_s / IDLE_GRAMMAR_WAIT_S idle steps, then a few that run; spinning made thousands.
    assert num_steps < compile_s / IDLE_GRAMMAR_WAIT_S + 20, num_steps
