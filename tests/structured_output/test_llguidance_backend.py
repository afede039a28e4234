"""The llguidance backend on the tiny tokenizer: sampled outputs checked by real oracles
(jsonschema, re.fullmatch, membership), compile errors, rollback, parallel fill."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jsonschema
import pytest
import tomllib
import torch

from minivllm.structured_output import StructuredOutputsParams, allocate_bitmask
from minivllm.structured_output.llguidance_backend import (
    MIN_LLGUIDANCE,
    PARALLEL_ADVANCE_MIN_ROWS,
    PARALLEL_ADVANCE_MIN_THREADS,
    LLGuidanceBackend,
    check_llguidance_version,
)
from tests.structured_output.conftest import generate

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
EMAIL = r"[a-z]{2,5}@[a-z]{3}\.(com|org)"
LIST = 'start: "[" NUMBER ("," NUMBER)* "]"\nNUMBER: /[0-9]{1,3}/'


CHOICES = ["yes", "no", "maybe not", 'say "hi"']
GBNF = 'root ::= "on" | "off" | num\nnum ::= [0-9] [0-9]?'
ORACLES = {  # params -> the check of a sampled text
    "regex": (StructuredOutputsParams(regex=EMAIL), lambda text: re.fullmatch(EMAIL, text)),
    "choice": (StructuredOutputsParams(choice=CHOICES), lambda text: text in CHOICES),
    "lark": (
        StructuredOutputsParams(grammar=LIST),
        lambda text: re.fullmatch(r"\[[0-9]{1,3}(,[0-9]{1,3})*\]", text),
    ),
    "gbnf": (
        StructuredOutputsParams(grammar=GBNF),
        lambda text: re.fullmatch("on|off|[0-9]{1,2}", text),
    ),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("greedy", [False, True])
def test_json_schema_outputs_validate(tiny_backend, tiny_tokenizer, seed, greedy):
    params = StructuredOutputsParams(json=PERSON)
    token_ids = generate(tiny_backend, params, seed, greedy=greedy, logits_vocab=512)
    jsonschema.validate(json.loads(tiny_tokenizer.decode(token_ids)), PERSON)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ORACLES)
def test_regex_choice_and_grammar_outputs_match(tiny_backend, tiny_tokenizer, kind, seed):
    params, check = ORACLES[kind]
    text = tiny_tokenizer.decode(generate(tiny_backend, params, seed))
    assert check(text), text


def test_json_object_accepts_objects_only(tiny_backend, tiny_tokenizer):
    grammar = tiny_backend.compile(StructuredOutputsParams(json_object=True).spec_key())
    obj = tiny_tokenizer.encode('{"a": [1, 2.5, "x"], "b": {"c": null}}')
    matcher = tiny_backend.new_matcher(grammar)
    assert matcher.accept_tokens(obj) and matcher.is_accepting()
    matcher = tiny_backend.new_matcher(grammar)
    assert not matcher.accept_tokens(tiny_tokenizer.encode("[1]"))
    assert matcher.validate_tokens(tiny_tokenizer.encode("[1]")) == 0


@pytest.mark.parametrize(
    "params, match",
    [
        (StructuredOutputsParams(json={"type": "foo"}), "invalid structured output json: .*foo"),
        (
            StructuredOutputsParams(json={"dependentSchemas": {}}),
            "Unimplemented keys.*dependentSchemas",
        ),
        (StructuredOutputsParams(json={"$ref": "#/defs/x"}), "/defs/x"),
        (StructuredOutputsParams(regex="[a-"), "(?s)regex: .*unclosed character class"),
        (StructuredOutputsParams(grammar="start: foo"), 'unknown name: "foo"'),
        (StructuredOutputsParams(grammar='root ::= ("a" '), r"GBNF.*Expected '\)'"),
    ],
)
def test_bad_specs_raise_value_error(tiny_backend, params, match):
    with pytest.raises(ValueError, match=match):
        tiny_backend.compile(params.spec_key())


def mask_of(matcher, vocab_size):
    bitmask = allocate_bitmask(1, vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    return bitmask.clone()


def test_rollback_then_reaccept_gives_the_same_mask(tiny_backend, tiny_tokenizer):
    grammar = tiny_backend.compile(StructuredOutputsParams(json=PERSON).spec_key())
    matcher = tiny_backend.new_matcher(grammar)
    prefix = tiny_tokenizer.encode('{"name": "Al", "age": 4')
    vocab = tiny_backend.vocab_size
    start = mask_of(matcher, vocab)
    masks = []
    for token in prefix:
        assert matcher.accept_tokens([token])
        masks.append(mask_of(matcher, vocab))
    matcher.rollback(3)
    assert torch.equal(mask_of(matcher, vocab), masks[-4])
    assert matcher.accept_tokens(prefix[-3:])
    assert torch.equal(mask_of(matcher, vocab), masks[-1])
    with pytest.raises(ValueError, match=f"cannot roll back {len(prefix) + 1} tokens"):
        matcher.rollback(len(prefix) + 1)
    matcher.reset()
    assert torch.equal(mask_of(matcher, vocab), start)


def test_rejected_tokens_leave_the_matcher_unchanged(tiny_backend, tiny_tokenizer):
    matcher = tiny_backend.new_matcher(
        tiny_backend.compile(StructuredOutputsParams(regex="[0-9]+").spec_key())
    )
    assert matcher.accept_tokens(tiny_tokenizer.encode("12"))
    before = mask_of(matcher, tiny_backend.vocab_size)
    assert not matcher.accept_tokens(tiny_tokenizer.encode("3x"))
    assert torch.equal(mask_of(matcher, tiny_backend.vocab_size), before)
    assert matcher.accept_tokens(tiny_tokenizer.encode("3"))


def test_eos_only_where_the_grammar_accepts_and_after_a_stop(tiny_backend, tiny_tokenizer):
    eos = tiny_backend.eos_token_ids[0]
    matcher = tiny_backend.new_matcher(
        tiny_backend.compile(StructuredOutputsParams(choice=["yes", "yesno"]).spec_key())
    )
    assert not matcher.accept_tokens([eos])
    assert matcher.accept_tokens(tiny_tokenizer.encode("yes"))
    assert matcher.is_accepting() and not matcher.is_finished()
    assert matcher.accept_tokens(tiny_tokenizer.encode("no")) and matcher.is_finished()
    assert matcher.validate_tokens([eos, eos]) == 1
    assert matcher.accept_tokens([eos]) and matcher.is_finished()
    matcher.rollback(1 + len(tiny_tokenizer.encode("no")))  # EOS after the stop included
    assert matcher.is_accepting() and not matcher.is_finished()
    assert matcher.accept_tokens([eos]) and matcher.is_finished()
    matcher.rollback(1)
    assert not matcher.is_finished()


def test_parallel_fill_equals_one_by_one(tiny_backend, tiny_tokenizer):
    specs = [
        StructuredOutputsParams(json=PERSON),
        StructuredOutputsParams(regex=EMAIL),
        StructuredOutputsParams(choice=["a", "b"]),
    ]
    matchers = [tiny_backend.new_matcher(tiny_backend.compile(p.spec_key())) for p in specs]
    matchers[0].accept_tokens(tiny_tokenizer.encode('{"na'))
    matchers[1].accept_tokens(tiny_tokenizer.encode("ab@"))
    together = allocate_bitmask(4, tiny_backend.vocab_size)
    tiny_backend.fill_bitmasks([(matchers[0], 3), (matchers[1], 0), (matchers[2], 1)], together)
    for matcher, row in [(matchers[0], 3), (matchers[1], 0), (matchers[2], 1)]:
        assert torch.equal(together[row], mask_of(matcher, tiny_backend.vocab_size)[0])
    assert (together[2] == -1).all()


@pytest.mark.parametrize(
    "bad",
    [
        lambda words: torch.full((2, words), -1, dtype=torch.int64),
        lambda words: torch.full((words, 2), -1, dtype=torch.int32).t(),
    ],
    ids=["int64", "not-contiguous"],
)
def test_a_bitmask_llguidance_cannot_write_is_refused(tiny_backend, bad):
    """llguidance writes masks through a raw pointer: a tensor of another layout is an error,
    never memory written out of bounds."""
    matcher = tiny_backend.new_matcher(
        tiny_backend.compile(StructuredOutputsParams(json_object=True).spec_key())
    )
    bitmask = bad(allocate_bitmask(1, tiny_backend.vocab_size).shape[1])
    with pytest.raises(ValueError, match="contiguous int32 host tensor"):
        tiny_backend.fill_bitmasks([(matcher, 0)], bitmask)
    with pytest.raises(ValueError, match="contiguous int32 host tensor"):
        matcher.fill_bitmask(bitmask, 0)


def test_model_vocab_larger_than_the_tokenizer(tiny_tokenizer):
    backend = LLGuidanceBackend(tiny_tokenizer, vocab_size=600)
    assert backend.vocab_size == 600
    matcher = backend.new_matcher(
        backend.compile(StructuredOutputsParams(json_object=True).spec_key())
    )
    bitmask = mask_of(matcher, 600)
    assert bitmask.shape == (1, 19)
    bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    assert bits.flatten()[len(tiny_tokenizer) :].sum() == 0


def test_a_shared_grammar_gets_a_lane_per_thread_and_matches_alike_on_each(tiny_tokenizer):
    """A deep copy shares its template's lexer state, and with it one mutex: a grammar that
    a second request asks for gets one template per pool thread, built in the background;
    requests take them in turn and match alike whichever they got. One used once keeps its
    one template."""
    backend = LLGuidanceBackend(tiny_tokenizer, num_threads=3)
    once = backend.compile(StructuredOutputsParams(regex="[0-9]+").spec_key())
    backend.new_matcher(once)
    grammar = backend.compile(StructuredOutputsParams(json=PERSON).spec_key())
    assert len(grammar.lanes) == 1
    first, second = backend.new_matcher(grammar), backend.new_matcher(grammar)
    deadline = time.monotonic() + 30
    while len(grammar.lanes) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(grammar.lanes) == 3 and len({id(lane) for lane in grammar.lanes}) == 3
    assert len(once.lanes) == 1
    later = [backend.new_matcher(grammar) for _ in range(3)]  # turns 2, 3, 4: every lane
    matchers = [first, second, *later]
    prefix = tiny_tokenizer.encode('{"name": "Al", "ag')
    for matcher in matchers:
        assert matcher.accept_tokens(prefix)
    together = allocate_bitmask(len(matchers), backend.vocab_size)
    backend.fill_bitmasks([(m, row) for row, m in enumerate(matchers)], together)
    alone = mask_of(matchers[0], backend.vocab_size)[0]
    assert not (alone == -1).all()
    for row in range(len(matchers)):
        assert torch.equal(together[row], alone)
    token = tiny_tokenizer.encode("e")[0]
    assert backend.accept_token_batch([(m, token) for m in matchers]) == [True] * 5
    together = allocate_bitmask(len(matchers), backend.vocab_size)
    backend.fill_bitmasks([(m, row) for row, m in enumerate(matchers)], together)
    assert all(torch.equal(together[row], together[0]) for row in range(1, len(matchers)))


def test_an_llguidance_older_than_the_pin_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"llguidance >= 1\.9, but 1\.3\.0 is installed"):
        check_llguidance_version("1.3.0")
    check_llguidance_version("1.9.1")
    check_llguidance_version("2.0.0rc1")
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    pins = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (pin,) = [p for p in pins if p.startswith("llguidance")]
    assert pin == "llguidance>=" + ".".join(map(str, MIN_LLGUIDANCE))


def test_a_large_batch_advances_on_the_pool_as_one_by_one(tiny_backend, tiny_tokenizer):
    """From PARALLEL_ADVANCE_MIN_ROWS rows on, a pool of PARALLEL_ADVANCE_MIN_THREADS threads
    advances the batch: the same answers and matcher states as one by one, with a rejected
    token, a grammar that has ended taking EOS (checked, not consumed) and refusing more."""
    pooled = LLGuidanceBackend(tiny_tokenizer, num_threads=PARALLEL_ADVANCE_MIN_THREADS)
    eos = tiny_backend.eos_token_ids[0]
    prefix = tiny_tokenizer.encode('{"name": "Al", "ag')
    good, bad = tiny_tokenizer.encode("e")[0], tiny_tokenizer.encode("}")[0]

    def batch(backend):
        grammar = backend.compile(StructuredOutputsParams(json=PERSON).spec_key())
        ended = backend.compile(StructuredOutputsParams(choice=["yes"]).spec_key())
        matchers = [backend.new_matcher(grammar) for _ in range(PARALLEL_ADVANCE_MIN_ROWS)]
        for matcher in matchers:
            assert matcher.accept_tokens(prefix)
        finished = [backend.new_matcher(ended) for _ in range(2)]
        for matcher in finished:
            assert matcher.accept_tokens(tiny_tokenizer.encode("yes"))
            assert matcher.is_finished()
        tokens = [good] * (len(matchers) - 1) + [bad, eos, good]
        return [*matchers, *finished], tokens

    one_by_one, tokens = batch(tiny_backend)
    side_by_side, same_tokens = batch(pooled)
    assert tokens == same_tokens
    expected = [True] * (PARALLEL_ADVANCE_MIN_ROWS - 1) + [False, True, False]
    assert tiny_backend.accept_token_batch(list(zip(one_by_one, tokens))) == expected
    assert pooled.accept_token_batch(list(zip(side_by_side, tokens))) == expected
    vocab = tiny_backend.vocab_size
    taken = [len(prefix)] * PARALLEL_ADVANCE_MIN_ROWS + [len(tiny_tokenizer.encode("yes"))] * 2
    for alone, pooled_matcher, ok, before in zip(one_by_one, side_by_side, expected, taken):
        if alone.error() is not None:  # the rejected token failed both matchers
            assert pooled_matcher.error() is not None
            continue
        assert torch.equal(mask_of(alone, vocab), mask_of(pooled_matcher, vocab))
        # The token counted where taken: the matcher rolls back to its start, no further.
        for matcher in (alone, pooled_matcher):
            with pytest.raises(ValueError, match="cannot roll back"):
                matcher.rollback(before + ok + 1)
            matcher.rollback(before + ok)
        assert torch.equal(mask_of(alone, vocab), mask_of(pooled_matcher, vocab))
