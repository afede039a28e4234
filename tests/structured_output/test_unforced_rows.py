"""The forced-token lookup's skip (bitmask.unforced_rows): a mask that allows two single-byte
tokens shows two possible next bytes, so the grammar forces nothing there; checked against
llguidance's own forced tokens along sampled outputs, on the tiny and the real vocabulary."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm.structured_output import StructuredOutputsParams, allocate_bitmask
from minivllm.structured_output.bitmask import byte_token_words, unforced_rows
from tests.structured_output.conftest import generate

# bench_structured.py's schema: its optional whitespace is where greedy random-weight outputs loop.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "integer"},
    },
    "required": ["name", "tags", "score"],
}
SPECS = [
    StructuredOutputsParams(json=SCHEMA),
    StructuredOutputsParams(grammar='start: "[" NUMBER ("," NUMBER)* "]"\nNUMBER: /[0-9]{1,3}/'),
    StructuredOutputsParams(regex=r"(abc|abd)[0-9]+, then a forced sentence( x{2,3})?"),
]


@pytest.fixture(params=["tiny_backend", "demo_backend"])
def backend(request):
    return request.getfixturevalue(request.param)


def test_byte_token_ids_are_one_non_special_token_per_byte(backend) -> None:
    tokenizer = backend.tokenizer
    spellings = [tokenizer.decode_bytes([t]) for t in backend.byte_token_ids]
    assert all(len(s) == 1 for s in spellings)
    assert len(set(spellings)) == len(spellings)
    assert not any(tokenizer.is_special_token(t) for t in backend.byte_token_ids)
    assert {b" ", b"\n", b":", b'"'} <= set(spellings)


@pytest.mark.parametrize("spec", SPECS, ids=["json", "lark", "regex"])
def test_an_unforced_row_has_no_forced_tokens(backend, spec) -> None:
    """Along sampled outputs, every state whose mask unforced_rows flags has no forced
    tokens; the walks also pass forced states (so the flag is not always set)."""
    probe = byte_token_words(backend.byte_token_ids)
    grammar = backend.compile(spec.spec_key())
    bitmask = allocate_bitmask(1, backend.vocab_size)
    eos = set(backend.eos_token_ids)
    num_forced = num_unforced = 0
    for seed in range(6):
        generator = torch.Generator().manual_seed(seed)
        matcher = backend.new_matcher(grammar)
        for _ in range(60):
            if matcher.is_finished():
                break
            matcher.fill_bitmask(bitmask, 0)
            forced = matcher.forced_tokens()
            (unforced,) = unforced_rows(bitmask, *probe)
            assert not (unforced and forced), (spec.kind, matcher.matcher.compute_ff_bytes())
            num_forced += bool(forced)
            num_unforced += unforced
            allowed = [t for t in torch.nonzero(_bits(bitmask[0])).flatten().tolist()]
            allowed = [t for t in allowed if t not in eos and t < backend.vocab_size] or allowed
            token = allowed[int(torch.randint(len(allowed), (1,), generator=generator))]
            assert matcher.accept_tokens([token])
    assert num_forced and num_unforced


def test_json_optional_whitespace_is_unforced_though_narrow(demo_backend) -> None:
    """Between `{"name"` and its `:` the schema allows any whitespace: a narrow mask (no free
    text), yet two next bytes, so nothing is forced and the lookup is skipped."""
    matcher = demo_backend.new_matcher(demo_backend.compile(SPECS[0].spec_key()))
    assert matcher.accept_tokens(demo_backend.tokenizer.tokenize_str('{"name"\n\t\t'))
    bitmask = allocate_bitmask(1, demo_backend.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    assert matcher.forced_tokens() == []
    assert unforced_rows(bitmask, *byte_token_words([])) == [False]  # not wide
    assert unforced_rows(bitmask, *byte_token_words(demo_backend.byte_token_ids)) == [True]


def _bits(words: torch.Tensor) -> torch.Tensor:
    """int32 words -> bool per token id."""
    shifts = torch.arange(32, dtype=torch.int32)
    return ((words.unsqueeze(-1) >> shifts) & 1).flatten().bool()


@pytest.mark.parametrize("seed", range(3))
def test_disable_any_whitespace_gives_compact_valid_json(demo_backend, demo_tokenizer, seed):
    """No whitespace outside strings with the option; the default schema allows it."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
            "score": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["name", "tags", "score"],
        "additionalProperties": False,
    }
    params = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    text = demo_tokenizer.decode(generate(demo_backend, params, seed))
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    flexible = demo_backend.new_matcher(demo_backend.compile(SPECS[0].spec_key()))
    assert flexible.accept_tokens(demo_tokenizer.encode('{ "name"', add_special_tokens=False))
