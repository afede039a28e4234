"""What llguidance cannot honour is refused when the spec compiles (a ValueError naming the
limit), not at a request's second token; what it would compile for too long is refused before
(optional properties, MAX_SPEC_BYTES); a long choice list is one lexeme and works; an
ignore_eos request's mask drops EOS wherever its grammar may go on."""

from __future__ import annotations

import time

import numpy as np
import pytest

from minivllm.structured_output import StructuredOutputsParams, allocate_bitmask
from minivllm.structured_output.bitmask import drop_eos
from minivllm.structured_output.schema_limits import MAX_OPTIONAL_PROPERTIES

from .conftest import generate

MANY = [f"option {i}" for i in range(2100)]


@pytest.mark.parametrize(
    ("params", "limit"),
    [
        (StructuredOutputsParams(regex="a{1000}{1000}"), "too many expressions"),
        (  # 600 optional properties: a row of more than 2,000 items after the first key
            StructuredOutputsParams(
                json={"type": "object", "properties": {f"p{i}": {} for i in range(600)}}
            ),
            "max is 2000",
        ),
        (
            StructuredOutputsParams(
                json={
                    "type": "object",
                    "properties": {"a": {"type": "string", "pattern": "^a{1000}{1000}$"}},
                    "required": ["a"],
                    "x-guidance": {"whitespace_flexible": False},
                }
            ),
            "too many expressions",
        ),
    ],
)
def test_specs_past_the_engines_limits_fail_at_compile(tiny_backend, params, limit):
    with pytest.raises(ValueError, match="beyond the grammar engine's limits") as error:
        tiny_backend.compile(params.spec_key())
    assert limit in str(error.value)


def test_a_choice_of_2100_strings_compiles_and_is_followed(tiny_backend, tiny_tokenizer):
    params = StructuredOutputsParams(choice=MANY)
    for seed in range(3):
        text = tiny_tokenizer.decode(generate(tiny_backend, params, seed))
        assert text in MANY


@pytest.mark.parametrize("choices", [["a/b", "c|d"], ['q"uo\\te', "new\nline", "x.y*(z)"]])
def test_choice_strings_are_literal(tiny_backend, tiny_tokenizer, choices):
    params = StructuredOutputsParams(choice=choices)
    for seed in range(4):
        assert tiny_tokenizer.decode(generate(tiny_backend, params, seed)) in choices
    matcher = tiny_backend.new_matcher(tiny_backend.compile(params.spec_key()))
    assert not matcher.accept_tokens(tiny_tokenizer.encode("b"))


def test_drop_eos_keeps_it_only_where_the_grammar_has_ended(tiny_backend, tiny_tokenizer):
    eos = tiny_backend.eos_token_ids[0]
    grammar = tiny_backend.compile(StructuredOutputsParams(choice=["ab", "abab"]).spec_key())
    may_end, ended = tiny_backend.new_matcher(grammar), tiny_backend.new_matcher(grammar)
    assert may_end.accept_tokens(tiny_tokenizer.encode("ab")) and may_end.is_accepting()
    assert ended.accept_tokens(tiny_tokenizer.encode("abab"))
    bitmask = allocate_bitmask(2, tiny_backend.vocab_size)
    tiny_backend.fill_bitmasks([(may_end, 0), (ended, 1)], bitmask)
    words = bitmask.numpy().view(np.uint32)
    word, bit = eos // 32, np.uint32(1 << (eos % 32))
    assert words[0, word] & bit and words[1, word] & bit  # llguidance allows EOS in both
    before = words.copy()
    drop_eos(bitmask, [0, 1], tiny_backend.eos_token_ids)
    assert not words[0, word] & bit  # "ab" may go on: no EOS
    assert words[0].any()
    np.testing.assert_array_equal(words[1], before[1])  # "abab" has ended: EOS only, kept


def test_a_spec_past_the_size_limit_is_refused_before_it_compiles(tiny_backend):
    properties = {f"property_{i}": {"type": "string"} for i in range(10_000)}
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    params = StructuredOutputsParams(json=schema)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"more than the grammar engine's limit of 262,144 bytes"):
        tiny_backend.compile(params.spec_key())
    assert time.perf_counter() - start < 1.0


def optional_properties(num_optional: int) -> dict:
    """An object of one required property ("p0", first), then num_optional optional ones."""
    names = [f"p{i}" for i in range(num_optional + 1)]
    return {"type": "object", "properties": {name: {} for name in names}, "required": ["p0"]}


def test_too_many_optional_properties_are_refused_before_compiling():
    """8,000 optional properties in a nested object (a compile of about 8 s): refused while
    the params are built, in well under 50 ms, naming the limit and the object."""
    schema = {"type": "object", "properties": {"a/b": optional_properties(8000)}}
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"at #/properties/a~1b has 8,000 optional properties"):
        StructuredOutputsParams(json=schema)
    assert time.perf_counter() - start < 0.05
    limit = rf"limit of {MAX_OPTIONAL_PROPERTIES:,} \(MAX_OPTIONAL_PROPERTIES"
    with pytest.raises(ValueError, match=limit):
        StructuredOutputsParams(json=optional_properties(MAX_OPTIONAL_PROPERTIES + 1))
    cycle = optional_properties(1)
    cycle["properties"]["p1"] = cycle  # the walk ends; the schema is refused as before
    with pytest.raises(ValueError, match="nested too deeply"):
        StructuredOutputsParams(json=cycle)


def test_an_object_at_the_optional_properties_limit_compiles(tiny_backend, tiny_tokenizer):
    params = StructuredOutputsParams(json=optional_properties(MAX_OPTIONAL_PROPERTIES))
    matcher = tiny_backend.new_matcher(tiny_backend.compile(params.spec_key()))
    last = f"p{MAX_OPTIONAL_PROPERTIES}"
    assert matcher.accept_tokens(tiny_tokenizer.encode(f'{{"p0": 1, "{last}": 2}}'))
    assert matcher.is_accepting()
