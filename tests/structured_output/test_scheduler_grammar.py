"""The scheduler's side of structured outputs, with compiles the test controls: a request
whose grammar compiles waits without holding up others, a failed compile fails it alone,
the step carries the constrained rows, and the grammar's end finishes the request."""

from __future__ import annotations

import weakref
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.grammar import forced_drafts
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import PLACEHOLDER_TOKEN_ID, GrammarOutput, RunnerOutput, SchedulerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output import StructuredOutputRequest, StructuredOutputsParams
from minivllm.structured_output.bitmask import unpack_bitmask
from minivllm.structured_output.manager import StructuredOutputManager


class ControlledManager(StructuredOutputManager):
    """Compiles with the real backend, but hands out futures the test settles."""

    def __init__(self, backend) -> None:
        super().__init__("unused", backend.vocab_size, max_num_seqs=4)
        self._backend = backend
        self.futures: list[Future] = []

    @property
    def backend(self):
        return self._backend

    def new_request(
        self, params: StructuredOutputsParams, ignore_eos: bool = False
    ) -> StructuredOutputRequest:
        future: Future = Future()
        self.futures.append(future)
        return StructuredOutputRequest(params.spec_key(), future, self._backend)


def make_scheduler(manager: StructuredOutputManager) -> Scheduler:
    return Scheduler(4, 64, 64, BlockManager(32, 4, False), structured_outputs=manager)


def constrained(req_id: str, **spec) -> Request:
    params = SamplingParams(temperature=0.0, structured_outputs=StructuredOutputsParams(**spec))
    return Request(req_id, [1, 2, 3], params, arrival_time=0.0)


def run(scheduler: Scheduler, sched_out: SchedulerOutput, token_ids: list[int]):
    """A runner that samples token_ids (one per sampled chunk) and accepts no draft (the
    grammar's forced tokens go in as drafts: jump-forward)."""
    sampled = [c for c in sched_out.chunks if c.sample]
    out = RunnerOutput([c.req_id for c in sampled], token_ids)
    if any(c.num_draft_tokens for c in sampled):
        out.num_accepted_drafts = [0] * len(sampled)
    return scheduler.update(sched_out, out)


def test_compiling_request_waits_without_holding_up_others(tiny_backend) -> None:
    manager = ControlledManager(tiny_backend)
    scheduler = make_scheduler(manager)
    scheduler.add_request(constrained("a", regex="ab"))
    scheduler.add_request(Request("b", [4, 5], SamplingParams(), arrival_time=0.0))
    sched_out = scheduler.schedule()
    assert [c.req_id for c in sched_out.chunks] == ["b"]
    assert scheduler.grammar_output(sched_out) is None  # no constrained row this step
    run(scheduler, sched_out, [7])
    manager.futures[0].set_result(
        tiny_backend.compile(StructuredOutputsParams(regex="ab").spec_key())
    )
    sched_out = scheduler.schedule()
    assert [c.req_id for c in sched_out.chunks] == ["b", "a"]  # decode first
    grammar = scheduler.grammar_output(sched_out)
    assert isinstance(grammar, GrammarOutput) and grammar.rows == [1]
    bitmask = grammar.bitmask
    assert bitmask.dtype == np.int32 and bitmask.shape[0] == 1
    allowed = unpack_bitmask(torch.from_numpy(bitmask), tiny_backend.vocab_size)[0]
    token_a = tiny_backend.tokenizer.tokenize_str("a")[0]
    assert allowed[token_a] and allowed.sum() < tiny_backend.vocab_size


def test_failed_compile_fails_that_request_alone(tiny_backend) -> None:
    manager = ControlledManager(tiny_backend)
    scheduler = make_scheduler(manager)
    scheduler.add_request(constrained("a", regex="("))
    scheduler.add_request(Request("b", [4, 5], SamplingParams(), arrival_time=0.0))
    manager.futures[0].set_exception(ValueError("invalid structured output regex: ("))
    sched_out = scheduler.schedule()
    assert [c.req_id for c in sched_out.chunks] == ["b"]
    outputs = {o.req_id: o for o in run(scheduler, sched_out, [7])}
    assert outputs["a"].finished and outputs["a"].finish_reason == "error"
    assert "regex" in outputs["a"].error
    assert scheduler.num_constrained == 0 and not outputs["b"].finished


class MatcherlessBackend:
    """The real backend, except that making a matcher raises what a mismatched llguidance
    raised (an AttributeError from inside the backend)."""

    def __init__(self, backend) -> None:
        self._backend = backend

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def new_matcher(self, grammar):
        raise AttributeError("'LLTokenizer' object has no attribute 'eos_tokens'")


def test_a_matcher_that_cannot_be_made_fails_that_request_alone(tiny_backend) -> None:
    broken = MatcherlessBackend(tiny_backend)
    manager = ControlledManager(broken)
    scheduler = make_scheduler(manager)
    scheduler.add_request(constrained("a", regex="a+"))
    scheduler.add_request(Request("b", [4, 5], SamplingParams(), arrival_time=0.0))
    manager.futures[0].set_result(
        tiny_backend.compile(StructuredOutputsParams(regex="a+").spec_key())
    )
    sched_out = scheduler.schedule()
    assert [c.req_id for c in sched_out.chunks] == ["b"]
    outputs = {o.req_id: o for o in run(scheduler, sched_out, [7])}
    assert outputs["a"].finish_reason == "error"
    assert "matcher could not be made" in outputs["a"].error
    assert "eos_tokens" in outputs["a"].error
    assert not outputs["b"].finished


def test_failure_alone_is_reported_by_the_next_step(tiny_backend) -> None:
    manager = ControlledManager(tiny_backend)
    scheduler = make_scheduler(manager)
    scheduler.add_request(constrained("a", json_object=True))
    manager.futures[0].set_exception(ValueError("took longer than the 30 s time limit"))
    assert scheduler.has_unfinished_requests()
    sched_out = scheduler.schedule()
    assert sched_out.is_empty
    (out,) = scheduler.update(sched_out, RunnerOutput([], []))
    assert out.finish_reason == "error" and not scheduler.has_unfinished_requests()


def test_grammar_end_finishes_with_stop(tiny_backend) -> None:
    manager = ControlledManager(tiny_backend)
    scheduler = make_scheduler(manager)
    scheduler.add_request(constrained("a", choice=["ab"]))
    spec = StructuredOutputsParams(choice=["ab"]).spec_key()
    manager.futures[0].set_result(tiny_backend.compile(spec))
    token_ids = tiny_backend.tokenizer.tokenize_str("ab")
    out = None
    for token_id in token_ids:
        sched_out = scheduler.schedule()
        (out,) = run(scheduler, sched_out, [token_id])
    assert out.finished and out.finish_reason == "stop"
    assert scheduler.num_constrained == 0 and scheduler.can_schedule_ahead


def async_scheduler_of_two(tiny_backend, regex: str, num_blocks: int) -> AsyncScheduler:
    """An AsyncScheduler holding requests "x" and "y" under regex, their grammar compiled."""
    manager = ControlledManager(tiny_backend)
    scheduler = AsyncScheduler(
        4, 64, 64, BlockManager(num_blocks, 4, False), structured_outputs=manager
    )
    for req_id in "xy":
        scheduler.add_request(constrained(req_id, regex=regex))
    spec = StructuredOutputsParams(regex=regex).spec_key()
    for future in manager.futures:
        future.set_result(tiny_backend.compile(spec))
    return scheduler


class InFlight:
    """A launched step's handle whose result() the test can see being waited for."""

    def __init__(self, out: RunnerOutput) -> None:
        self.out = out
        self.waited = False

    def result(self) -> RunnerOutput:
        self.waited = True
        return self.out


def test_async_step_fills_its_mask_after_the_step_in_flight(tiny_backend) -> None:
    """A constrained step is scheduled while the step before it is in flight; its fill
    applies that step first (the matcher takes the token, the mask follows it), and a request
    the applied token fails gets every token allowed in its row (it is dropped anyway)."""
    scheduler = async_scheduler_of_two(tiny_backend, "[ab][cd]", num_blocks=32)
    token = {ch: tiny_backend.tokenizer.tokenize_str(ch)[0] for ch in "abcd"}
    prefill = scheduler.schedule()
    scheduler.grammar_output(prefill)
    in_flight = InFlight(RunnerOutput(["x", "y"], [token["a"], token["c"]]))  # "c": not allowed
    assert scheduler.update(prefill, in_flight) == []
    decode = scheduler.schedule()
    assert not in_flight.waited  # scheduled ahead of the step in flight
    assert [c.token_ids for c in decode.chunks] == [[PLACEHOLDER_TOKEN_ID]] * 2
    grammar = scheduler.grammar_output(decode)
    assert in_flight.waited and grammar.rows == [0, 1]
    allowed = unpack_bitmask(torch.from_numpy(grammar.bitmask), tiny_backend.vocab_size)
    assert allowed[0, token["c"]] and allowed[0, token["d"]] and not allowed[0, token["a"]]
    assert bool(allowed[1].all())  # y failed on "c"
    outputs = {o.req_id: o for o in scheduler.update(decode, InFlight(RunnerOutput([], [])))}
    assert outputs["x"].new_token_ids == [token["a"]] and not outputs["x"].finished
    assert outputs["y"].finish_reason == "error" and "satisfy the grammar" in outputs["y"].error


def test_a_busy_async_scheduler_keeps_no_past_step_alive(tiny_backend) -> None:
    """With a step always in flight, each constrained step's mask must not hold the step
    before it: that chained every step to the one before, all kept alive (host and device
    memory growing, every GC collection walking them) until the engine went idle."""
    scheduler = async_scheduler_of_two(tiny_backend, "a+", num_blocks=64)
    token_a = tiny_backend.tokenizer.tokenize_str("a")[0]
    steps = []
    for _ in range(12):
        sched_out = scheduler.schedule()
        steps.append(weakref.ref(sched_out))
        scheduler.grammar_output(sched_out)  # what the engine asks once the forward is launched
        sampled = [c.req_id for c in sched_out.chunks if c.sample]
        scheduler.update(sched_out, InFlight(RunnerOutput(sampled, [token_a] * len(sampled))))
        del sched_out
    assert scheduler.has_unfinished_requests()  # a step is in flight throughout
    # Freed by their reference counts (no collection): only the step in flight remains.
    assert [ref() is None for ref in steps] == [True] * 11 + [False]


def test_manager_builds_its_backend_off_the_caller_thread(tiny_qwen3_dir: str) -> None:
    """The first constrained request returns at once; its compile follows the build."""
    manager = StructuredOutputManager(tiny_qwen3_dir, 500, max_num_seqs=2)
    requests = [manager.new_request(StructuredOutputsParams(regex=r"[0-9]+")) for _ in range(2)]
    for request in requests:
        request._grammar.result(timeout=60)
        assert request.is_ready()
    bitmask = manager.fill(requests, [0, 1])
    assert bitmask.dtype == np.int32 and bitmask.shape == (2, 16)
    bad = manager.new_request(StructuredOutputsParams(regex="("))
    bad._grammar.exception(timeout=60)
    with pytest.raises(ValueError, match="regex"):
        bad.is_ready()


def test_requests_forcing_nothing_skip_the_forced_token_lookup(tiny_backend) -> None:
    """A request whose last mask showed nothing forced (here: wide, free text) is not asked
    for forced tokens; one whose mask was narrow is, and its forced text becomes its drafts."""
    grammar = 'start: "{\\"key\\": \\"" /[a-z ]+/ "\\"}"'
    manager = ControlledManager(tiny_backend)
    scheduler = make_scheduler(manager)
    scheduler.add_request(constrained("r", grammar=grammar))
    manager.futures[0].set_result(
        tiny_backend.compile(StructuredOutputsParams(grammar=grammar).spec_key())
    )
    prefill = scheduler.schedule()
    scheduler.grammar_output(prefill)
    so = scheduler.requests["r"].structured_output
    assert not so.forces_nothing  # `{"key": "` is forced: a narrow mask
    run(scheduler, prefill, [tiny_backend.tokenizer.tokenize_str("{")[0]])
    running = scheduler.running
    forced = forced_drafts(running, 64)
    expected = tiny_backend.tokenizer.tokenize_str('"key": "')
    assert forced["r"] == expected
    so.forces_nothing = True
    assert forced_drafts(running, 64) == {}
    # Inside the string: the mask allows most tokens.
    for token_id in expected + tiny_backend.tokenizer.tokenize_str("ab"):
        assert so.advance([token_id]) is None
    manager.fill([so], [0])
    assert so.forces_nothing


def test_forced_drafts_in_flight_do_not_stop_scheduling_ahead(tiny_backend) -> None:
    """Under async scheduling a step whose forced drafts are in flight does not make the
    next schedule wait for it: the other requests are scheduled ahead, the drafted one sits
    that step out, and once update() has applied its drafts it goes on from its last token."""
    grammar = 'start: "{\\"key\\": \\"" /[a-z]+/ "\\"}"'
    manager = ControlledManager(tiny_backend)
    scheduler = AsyncScheduler(4, 64, 64, BlockManager(32, 4, False), structured_outputs=manager)
    scheduler.add_request(constrained("r", grammar=grammar))
    scheduler.add_request(Request("u", [4, 5, 6], SamplingParams(temperature=0.0), 0.0))
    manager.futures[0].set_result(
        tiny_backend.compile(StructuredOutputsParams(grammar=grammar).spec_key())
    )
    forced = tiny_backend.tokenizer.tokenize_str('{"key": "')
    prefill = scheduler.schedule()
    scheduler.grammar_output(prefill)
    prefill_out = InFlight(RunnerOutput(["r", "u"], [forced[0], 7]))
    scheduler.update(prefill, prefill_out)
    decode = scheduler.schedule()  # r: its forced text drafted after the token in flight
    (r_chunk,) = [c for c in decode.chunks if c.req_id == "r"]
    num_drafts = r_chunk.num_draft_tokens  # as many as fit the decode rows
    assert num_drafts >= 1
    assert r_chunk.token_ids == [PLACEHOLDER_TOKEN_ID, *forced[1 : 1 + num_drafts]]
    scheduler.grammar_output(decode)
    target = forced[1 + num_drafts]
    decode_out = InFlight(
        RunnerOutput(
            ["r", "u"],
            [target, 8],
            num_accepted_drafts=[num_drafts, 0],
            num_draft_tokens=[num_drafts, 0],
            accepted_draft_ids=[forced[1 : 1 + num_drafts], []],
        )
    )
    scheduler.update(decode, decode_out)
    ahead = scheduler.schedule()
    assert not decode_out.waited  # scheduled ahead of the drafted step
    assert [c.req_id for c in ahead.chunks] == ["u"]  # r sits it out
    outputs = {o.req_id: o for o in scheduler.update(ahead, InFlight(RunnerOutput(["u"], [9])))}
    assert outputs["r"].new_token_ids == forced[1 : 2 + num_drafts]  # forced[0]: the step before
    request = scheduler.requests["r"]
    assert request.output_token_ids == forced[: 2 + num_drafts]
    assert request.num_computed_tokens == request.num_tokens - 1
    after = scheduler.schedule()
    (r_chunk,) = [c for c in after.chunks if c.req_id == "r"]
    assert r_chunk.token_ids[0] == target and r_chunk.num_computed_tokens == request.num_tokens - 1
