"""The batched advance (one token for each of many requests in one backend call): it equals
advancing one by one, keeps rollback working (an EOS after the stop included), and a
violation fails only its request, also through the scheduler."""

from __future__ import annotations

from concurrent.futures import Future

import torch

from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output import (
    GrammarViolation,
    StructuredOutputBackend,
    StructuredOutputRequest,
    StructuredOutputsParams,
    allocate_bitmask,
)
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.structured_output.request_state import advance_batch
from tests.structured_output.conftest import generate

SPECS = [
    StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
    StructuredOutputsParams(regex="[0-9]{2,6}"),
    StructuredOutputsParams(choice=["yes", "no"]),
]


def request_for(backend, params: StructuredOutputsParams) -> StructuredOutputRequest:
    future: Future = Future()
    future.set_result(backend.compile(params.spec_key()))
    request = StructuredOutputRequest(params.spec_key(), future, backend)
    assert request.is_ready()  # makes its matcher
    return request


def masks(requests, vocab_size: int) -> torch.Tensor:
    bitmask = allocate_bitmask(len(requests), vocab_size)
    for row, request in enumerate(requests):
        request.fill_bitmask(bitmask, row)
    return bitmask


def test_batched_advance_equals_one_by_one(tiny_backend) -> None:
    eos = tiny_backend.eos_token_ids[0]
    # Each output, then EOS where the grammar has not stopped by itself.
    outputs = [generate(tiny_backend, p, seed) + [eos] for seed, p in enumerate(SPECS)]
    batched = [request_for(tiny_backend, p) for p in SPECS]
    single = [request_for(tiny_backend, p) for p in SPECS]
    live = list(range(len(SPECS)))
    for step in range(max(len(o) for o in outputs)):
        live = [k for k in live if step < len(outputs[k]) and not single[k].is_finished()]
        if not live:
            break
        token_ids = [outputs[k][step] for k in live]
        got = advance_batch(tiny_backend, [batched[k] for k in live], token_ids)
        assert got == [single[k].advance([t]) for k, t in zip(live, token_ids)]
        assert [batched[k].accepted_token_ids for k in live] == [
            single[k].accepted_token_ids for k in live
        ]
        assert torch.equal(
            masks(batched, tiny_backend.vocab_size), masks(single, tiny_backend.vocab_size)
        )
    assert all(r.is_finished() for r in batched)
    for request in batched:
        request.rollback(request.num_accepted_tokens)  # every token was counted right
    assert torch.equal(
        masks(batched, tiny_backend.vocab_size),
        masks([request_for(tiny_backend, p) for p in SPECS], tiny_backend.vocab_size),
    )


def test_eos_after_the_stop_in_a_batch_is_checked_not_consumed(tiny_backend) -> None:
    eos = tiny_backend.eos_token_ids[0]
    params = StructuredOutputsParams(choice=["ab"])
    request = request_for(tiny_backend, params)
    token_ids = tiny_backend.tokenizer.tokenize_str("ab")
    assert request.advance(token_ids) == "stop"
    assert advance_batch(tiny_backend, [request], [eos]) == ["stop"]
    request.rollback(1)  # the EOS alone: the grammar is still at its stop
    assert request.is_finished() and request.accepted_token_ids == token_ids
    request.rollback(len(token_ids))
    fresh = request_for(tiny_backend, params)
    vocab_size = tiny_backend.vocab_size
    assert torch.equal(masks([request], vocab_size), masks([fresh], vocab_size))
    (violation,) = advance_batch(tiny_backend, [request], [eos])
    assert isinstance(violation, GrammarViolation)  # EOS only where the grammar accepts


def test_a_stopped_matcher_among_live_ones_in_a_batch(tiny_backend, tiny_tokenizer) -> None:
    """The stopped one's EOS is checked alone, the live ones advance together, in order."""
    eos = tiny_backend.eos_token_ids[0]
    ab, digits = StructuredOutputsParams(choice=["ab"]), StructuredOutputsParams(regex="[0-9]+")
    stopped = request_for(tiny_backend, ab)
    assert stopped.advance(tiny_backend.tokenizer.tokenize_str("ab")) == "stop"
    live = [request_for(tiny_backend, digits) for _ in range(2)]
    one, x = tiny_tokenizer.encode("1")[0], tiny_tokenizer.encode("x")[0]
    outcomes = advance_batch(tiny_backend, [live[0], stopped, live[1]], [one, eos, x])
    assert outcomes[:2] == [None, "stop"] and isinstance(outcomes[2], GrammarViolation)
    assert [r.accepted_token_ids for r in live] == [[one], []]
    stopped.rollback(stopped.num_accepted_tokens)  # the EOS was checked, the rest consumed
    live[0].rollback(1)
    fresh = [request_for(tiny_backend, p) for p in (ab, digits)]
    vocab_size = tiny_backend.vocab_size
    assert torch.equal(masks([stopped, live[0]], vocab_size), masks(fresh, vocab_size))


def test_a_violation_fails_only_its_request(tiny_backend, tiny_tokenizer) -> None:
    digits = StructuredOutputsParams(regex="[0-9]+")
    requests = [request_for(tiny_backend, digits) for _ in range(3)]
    one, x = tiny_tokenizer.encode("1")[0], tiny_tokenizer.encode("x")[0]
    outcomes = advance_batch(tiny_backend, requests, [one, x, one])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], GrammarViolation) and "regex grammar" in str(outcomes[1])
    assert [r.accepted_token_ids for r in requests] == [[one], [], [one]]
    assert advance_batch(tiny_backend, [requests[0], requests[2]], [one, one]) == [None, None]


def test_default_batched_accept_leaves_a_rejecting_matcher_where_it_was(tiny_backend) -> None:
    grammar = tiny_backend.compile(StructuredOutputsParams(regex="[0-9]+").spec_key())
    matchers = [tiny_backend.new_matcher(grammar) for _ in range(2)]
    one, x = (tiny_backend.tokenizer.tokenize_str(s)[0] for s in ("1", "x"))
    default = StructuredOutputBackend.accept_token_batch  # the interface's plain version
    assert default(tiny_backend, [(matchers[0], one), (matchers[1], x)]) == [True, False]
    assert matchers[1].error() is None and matchers[1].accept_tokens([one])


class ReadyManager(StructuredOutputManager):
    """Compiles with the given backend; every grammar is ready from the start."""

    def __init__(self, backend) -> None:
        super().__init__("unused", backend.vocab_size, max_num_seqs=4)
        self._backend = backend

    @property
    def backend(self):
        return self._backend

    def new_request(
        self, params: StructuredOutputsParams, ignore_eos: bool = False
    ) -> StructuredOutputRequest:
        return request_for(self._backend, params)


def test_scheduler_fails_the_violating_request_alone(tiny_backend, tiny_tokenizer) -> None:
    scheduler = Scheduler(4, 64, 64, BlockManager(32, 4, False), ReadyManager(tiny_backend))
    so = StructuredOutputsParams(regex="[0-9]+")
    for req_id in ("a", "b"):
        params = SamplingParams(temperature=0.0, structured_outputs=so)
        scheduler.add_request(Request(req_id, [1, 2, 3], params, arrival_time=0.0))
    scheduler.add_request(Request("c", [4, 5], SamplingParams(), arrival_time=0.0))
    one, x = tiny_tokenizer.encode("1")[0], tiny_tokenizer.encode("x")[0]
    sched_out = scheduler.schedule()
    req_ids = [c.req_id for c in sched_out.chunks if c.sample]
    token_of = {"a": one, "b": x, "c": x}
    outputs = scheduler.update(sched_out, RunnerOutput(req_ids, [token_of[r] for r in req_ids]))
    by_id = {o.req_id: o for o in outputs}
    assert by_id["b"].finish_reason == "error" and "regex grammar" in by_id["b"].error
    assert by_id["b"].new_token_ids == [x]
    assert not by_id["a"].finished and not by_id["c"].finished
    assert scheduler.num_constrained == 1
    assert scheduler.requests["a"].structured_output.accepted_token_ids == [one]


def test_end_grammar_takes_the_batched_outcome_once(tiny_backend) -> None:
    """end_grammar applies the outcome advance_grammars took for a request's token and pops
    it; a request the batch did not advance (several new tokens) is advanced there and then,
    by its last output token. Both end at the same token, with reason 'stop'."""
    from minivllm.engine.sched.grammar import end_grammar

    params = SPECS[2]  # choice: "yes" | "no"
    eos = tiny_backend.eos_token_ids[0]
    output = generate(tiny_backend, params, 0) + [eos]
    sampling = SamplingParams(structured_outputs=params)
    batched = Request("batched", [1], sampling, 0.0)
    single = Request("single", [1], sampling, 0.0)
    for request in (batched, single):
        request.structured_output = request_for(tiny_backend, params)
    for n, token in enumerate(output):
        outcomes = advance_batch(tiny_backend, [batched.structured_output], [token])
        advanced = {"batched": outcomes[0]}
        ended = []
        for request in (batched, single):
            request.append_output_token(token)
            ended.append(end_grammar(request, advanced))
        assert advanced == {}  # used once
        assert single.structured_output.accepted_token_ids == output[: n + 1]
        assert ended[0] == ended[1]
        if ended[0]:
            break
    assert batched.finish_reason == single.finish_reason == "stop"
    assert batched.output_token_ids == single.output_token_ids
    advanced = {"batched": GrammarViolation("no")}
    assert end_grammar(batched, advanced) is True and batched.finish_reason == "error"
    assert advanced == {} and batched.error == "no"
