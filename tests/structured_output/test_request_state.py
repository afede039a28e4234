"""StructuredOutputRequest: readiness, advance and its 'stop', violations, rollback and sync."""

from __future__ import annotations

from concurrent.futures import Future

import llguidance
import pytest
import torch

from minivllm.structured_output import (
    GrammarViolation,
    StructuredOutputRequest,
    StructuredOutputsParams,
    allocate_bitmask,
    llguidance_backend,
)
from minivllm.structured_output.llguidance_backend import LLGuidanceBackend


def request_for(backend, params: StructuredOutputsParams) -> StructuredOutputRequest:
    spec = params.spec_key()
    future: Future = Future()
    future.set_result(backend.compile(spec))
    return StructuredOutputRequest(spec, future, backend)


def mask_of(request, vocab_size):
    bitmask = allocate_bitmask(1, vocab_size)
    request.fill_bitmask(bitmask, 0)
    return bitmask


def test_not_ready_until_compiled_and_compile_errors_surface(tiny_backend):
    spec = StructuredOutputsParams(regex="a").spec_key()
    future: Future = Future()
    request = StructuredOutputRequest(spec, future, tiny_backend)
    assert not request.is_ready()
    with pytest.raises(RuntimeError, match="not compiled yet"):
        request.advance([1])
    future.set_exception(ValueError("invalid structured output regex: x"))
    with pytest.raises(ValueError, match="invalid structured output regex"):
        request.is_ready()


def test_advance_reports_the_grammar_end(tiny_backend, tiny_tokenizer):
    request = request_for(tiny_backend, StructuredOutputsParams(choice=["yes", "no"]))
    assert request.is_ready()
    y, es = tiny_tokenizer.encode("yes")
    assert request.advance([y]) is None
    assert request.advance([es]) == "stop" and request.is_finished()
    assert request.num_accepted_tokens == 2
    request = request_for(tiny_backend, StructuredOutputsParams(regex="[0-9]+"))
    request.is_ready()
    assert request.advance(tiny_tokenizer.encode("42")) is None
    assert request.advance([tiny_backend.eos_token_ids[0]]) == "stop"


def test_a_disallowed_token_is_a_violation(tiny_backend, tiny_tokenizer):
    request = request_for(tiny_backend, StructuredOutputsParams(regex="[0-9]+"))
    request.is_ready()
    ids = tiny_tokenizer.encode("12") + tiny_tokenizer.encode("x")
    with pytest.raises(GrammarViolation, match=f"output token {ids[-1]} at position 2"):
        request.advance(ids)
    assert request.accepted_token_ids == ids[:-1]


def test_sync_rolls_back_and_replays(tiny_backend, tiny_tokenizer):
    params = StructuredOutputsParams(json={"type": "object"})
    request = request_for(tiny_backend, params)
    request.is_ready()
    request.advance(tiny_tokenizer.encode('{"ab": 1'))
    target = tiny_tokenizer.encode('{"ab": [2')  # shares a prefix, then differs
    assert request.sync(target) is None
    assert request.accepted_token_ids == target
    fresh = request_for(tiny_backend, params)
    fresh.is_ready()
    fresh.advance(target)
    vocab = tiny_backend.vocab_size
    assert torch.equal(mask_of(request, vocab), mask_of(fresh, vocab))
    request.rollback(len(target))
    assert request.accepted_token_ids == []
    with pytest.raises(ValueError, match="cannot roll back 1 tokens: 0 were accepted"):
        request.rollback(1)


def test_a_matcher_past_a_parser_limit_fails_the_request(tiny_tokenizer, monkeypatch):
    # A limit that the compile's probe walk did not meet (its walk is skipped here) still
    # fails the request, at the step that meets it.
    monkeypatch.setattr(llguidance_backend, "probe_error", lambda *_: None)
    backend = LLGuidanceBackend(tiny_tokenizer, limits=llguidance.LLParserLimits(step_max_items=2))
    request = request_for(backend, StructuredOutputsParams(json={"type": "object"}))
    request.is_ready()
    mask_of(request, backend.vocab_size)  # the limit is hit computing this mask
    with pytest.raises(GrammarViolation, match="json grammar failed: .*Too many items"):
        request.advance(tiny_tokenizer.encode('{"a": 1}'))
    assert request.matcher.error() is not None and not request.is_finished()
