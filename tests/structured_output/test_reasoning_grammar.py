"""A constraint after the reasoning (entrypoints/parsers/reasoning/constraint.py), compiled by
llguidance on the tiny tokenizer: free text up to `</think>` is accepted, then every random
completion the mask allows satisfies the constraint; before `</think>` the constraint does
not hold, and with reasoning off it holds from the first token."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from minivllm.entrypoints.parsers.reasoning.constraint import (
    after_reasoning,
    has_special_markers,
    reasoning_start,
)
from minivllm.structured_output import StructuredOutputsParams, allocate_bitmask, apply_bitmask
from minivllm.structured_output.llguidance_backend import LLGuidanceBackend
from minivllm.tiny_model import build_tiny_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
THOUGHT = 'I could answer {"city": 1} or use a / or </thin but '
# (params, a check of the text after the reasoning)
CONSTRAINTS = {
    "json": (
        StructuredOutputsParams(json=SCHEMA),
        lambda t: jsonschema.validate(json.loads(t), SCHEMA),
    ),
    "json_object": (
        StructuredOutputsParams(json_object=True),
        lambda t: isinstance(json.loads(t), dict) or pytest.fail(t),
    ),
    "regex": (
        StructuredOutputsParams(regex=r"[a-c]{2}/[0-9]\n?"),
        lambda t: re.fullmatch(r"[a-c]{2}/[0-9]\n?", t) or pytest.fail(t),
    ),
    "choice": (
        StructuredOutputsParams(choice=["yes", "no </think>"]),
        lambda t: t in ("yes", "no </think>") or pytest.fail(t),
    ),
    # A Lark grammar whose strings and regexes say "start" (only the rule is renamed).
    "lark": (
        StructuredOutputsParams(grammar='start: "start" NUM\nNUM: /start|[0-9]{2}/ // start'),
        lambda t: re.fullmatch("start(start|[0-9]{2})", t) or pytest.fail(t),
    ),
    "gbnf": (
        StructuredOutputsParams(grammar='root ::= "x" [0-9] [0-9]'),
        lambda t: re.fullmatch("x[0-9]{2}", t) or pytest.fail(t),
    ),
}


def complete(backend, tokenizer, params, prefix: str, seed: int) -> str:
    """The text the grammar admits after prefix (which it must accept), sampled from random
    logits under the mask until the grammar ends ("}" favoured, so free objects close)."""
    matcher = backend.new_matcher(backend.compile(params.spec_key()))
    assert matcher.accept_tokens(tokenizer.encode(prefix, add_special_tokens=False)), prefix
    generator = torch.Generator().manual_seed(seed)
    bitmask = allocate_bitmask(1, backend.vocab_size)
    eos, token_ids = backend.eos_token_ids[0], []
    for _ in range(200):
        matcher.fill_bitmask(bitmask, 0)
        logits = torch.randn(1, backend.vocab_size, generator=generator) * 3
        logits[0, tokenizer.convert_tokens_to_ids("}")] += 6
        apply_bitmask(logits, bitmask, [0])
        token = int(logits[0].argmax())
        assert matcher.accept_tokens([token])
        if token != eos:
            token_ids.append(token)
        if matcher.is_finished():
            return tokenizer.decode(token_ids, skip_special_tokens=False)
    raise AssertionError("the grammar did not end")


def accepts(backend, tokenizer, params, text: str) -> tuple[bool, bool]:
    """(every token of text is allowed, the grammar may end there)."""
    matcher = backend.new_matcher(backend.compile(params.spec_key()))
    ids = tokenizer.encode(text, add_special_tokens=False)
    ok = matcher.accept_tokens(ids)
    return ok, ok and matcher.is_accepting()


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
@pytest.mark.parametrize("start", ["inside", "may_open"])
def test_the_constraint_holds_after_the_reasoning(tiny_backend, tiny_tokenizer, kind, start):
    params, check = CONSTRAINTS[kind]
    deferred = after_reasoning(params, start, special_markers=False)
    assert deferred.kind == "grammar"
    prefix = ("<think>" if start == "may_open" else "") + THOUGHT + "</think>"
    for seed in range(3):
        check(complete(tiny_backend, tiny_tokenizer, deferred, prefix, seed))


def test_before_the_end_marker_the_constraint_does_not_hold(tiny_backend, tiny_tokenizer):
    answer = '{"city":"Oslo","days":3}'
    inside = after_reasoning(StructuredOutputsParams(json=SCHEMA), "inside", False)
    assert accepts(tiny_backend, tiny_tokenizer, inside, answer) == (True, False)  # a thought
    assert accepts(tiny_backend, tiny_tokenizer, inside, "x</think>" + answer) == (True, True)
    assert accepts(tiny_backend, tiny_tokenizer, inside, "x</think>no")[0] is False
    assert accepts(tiny_backend, tiny_tokenizer, inside, "x</think></think>")[0] is False
    may_open = after_reasoning(StructuredOutputsParams(json=SCHEMA), "may_open", False)
    assert accepts(tiny_backend, tiny_tokenizer, may_open, answer) == (True, True)
    assert accepts(tiny_backend, tiny_tokenizer, may_open, "x</think>")[0] is False
    off = after_reasoning(StructuredOutputsParams(json=SCHEMA), "off", False)
    assert off == StructuredOutputsParams(json=SCHEMA)


def test_special_marker_tokens(tiny_tokenizer):
    special = build_tiny_tokenizer()
    special.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    assert has_special_markers(special) and not has_special_markers(tiny_tokenizer)
    backend = LLGuidanceBackend(special, num_threads=1)
    params = after_reasoning(StructuredOutputsParams(choice=["yes"]), "may_open", True)
    assert accepts(backend, special, params, "<think>a b</think>yes") == (True, True)
    assert accepts(backend, special, params, "yes") == (True, True)
    assert accepts(backend, special, params, "<think>a</think></think>")[0] is False


@pytest.mark.parametrize(
    "parser, prompt, kwargs, start",
    [
        (None, "<|im_start|>assistant\n", None, "off"),
        ("qwen3", "<|im_start|>assistant\n", {"enable_thinking": False}, "off"),
        ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", None, "off"),
        ("qwen3", "<|im_start|>assistant\n<think>\n", None, "inside"),
        ("deepseek_r1", "<think>a</think> b<|im_start|>assistant\n", {}, "may_open"),
        ("qwen3", "<|im_start|>assistant\n", {"enable_thinking": True}, "may_open"),
    ],
)
def test_where_the_output_starts(parser, prompt, kwargs, start):
    assert reasoning_start(parser, prompt, kwargs) == start
