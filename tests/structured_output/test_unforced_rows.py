"""The forced-token lookup's skip (bitmask.unforced_rows): a mask that allows two single-byte
tokens shows two possible next bytes, so the grammar forces nothing there; checked against
llguidance's own forced tokens along sampled outputs, on the tiny and the real vocabulary."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm.structured_output import StructuredOutputsParams, allocate_bitmask
from minivllm.structured_output import bitmask as bitmask_module
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


def _unforced_reference(words: list[int], byte_token_ids: list[int]) -> bool:
    """unforced_rows for one row of int32 words, token by token."""
    start = max(0, len(words) // 2 - 32)
    block = words[start : start + 64]
    wide = sum(w != 0 for w in block) * 4 > len(block)
    allowed_bytes = sum(words[t // 32] >> (t % 32) & 1 for t in byte_token_ids)
    return wide or allowed_bytes >= 2


@pytest.mark.parametrize("num_words", [8, 64, 200, 1536])
@pytest.mark.parametrize("contiguous", [True, False], ids=["byte-words-slice", "byte-words-array"])
@pytest.mark.parametrize("popcount", [True, False], ids=["popcount", "numpy-1-test"])
def test_unforced_rows_match_a_per_token_reference(
    num_words, contiguous, popcount, monkeypatch
) -> None:
    """Rows all allowed, none, all but the byte tokens, one token, bit 31, bits 30 and 31 of
    one word (a negative int32 whose absolute value has one bit), a few words, random
    densities; the byte tokens in the first words (a slice) or scattered (an index array);
    with numpy's popcount and with the test used where numpy has none (< 2.0)."""
    if not popcount:
        monkeypatch.setattr(bitmask_module, "_bitwise_count", None)
    elif bitmask_module._bitwise_count is None:
        pytest.skip("numpy < 2.0 has no bitwise_count")
    generator = torch.Generator().manual_seed(num_words)
    vocab_size = 32 * num_words
    if contiguous:
        byte_ids = list(range(3, 3 + min(256, vocab_size - 3)))
    else:
        byte_ids = sorted(torch.randperm(vocab_size, generator=generator)[:256].tolist())
    rows = [torch.full((num_words,), -1), torch.zeros(num_words, dtype=torch.int64)]
    no_bytes = torch.full((num_words,), 2**32 - 1)  # every token but the byte tokens: wide
    for token in byte_ids:
        no_bytes[token // 32] &= ~(1 << token % 32)
    rows.append(no_bytes)
    for token in (byte_ids[0], byte_ids[-1], 31, vocab_size - 1):
        row = torch.zeros(num_words, dtype=torch.int64)
        row[token // 32] = 1 << token % 32
        rows.append(row)
    byte_set = set(byte_ids)
    for top in [t for t in byte_ids if t % 32 == 31 and t - 1 in byte_set][:2]:
        row = torch.zeros(num_words, dtype=torch.int64)  # bits 30 and 31 of one word alone
        row[top // 32] = 3 << 30
        rows.append(row)
    for density in (0.01, 0.1, 0.26, 0.5, 0.99):
        bits = torch.randint(-(2**31), 2**31, (num_words,), generator=generator)
        keep = torch.rand(num_words, generator=generator) < density
        rows.append(bits * keep)
    bitmask = torch.stack(rows).to(torch.int64)
    bitmask = torch.where(bitmask >= 2**31, bitmask - 2**32, bitmask).to(torch.int32)
    expected = [_unforced_reference(row, byte_ids) for row in bitmask.tolist()]
    assert unforced_rows(bitmask, *byte_token_words(byte_ids)) == expected
    assert expected[:2] == [True, False]  # all allowed is wide, nothing allowed is not
    assert expected[2] == (num_words > 8)  # wide by the words in the middle alone
