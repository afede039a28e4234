"""StructuredOutputsParams: exactly one constraint, clear errors, canonical spec keys."""

from __future__ import annotations

import dataclasses
import pickle

import pydantic
import pytest

from minivllm.structured_output import StructuredOutputsParams, StructuredOutputSpec


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_each_kind_has_a_canonical_key():
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    by_dict = StructuredOutputsParams(json=schema)
    by_text = StructuredOutputsParams(json='{"type": "object",\n "properties": {"b": {}, "a": {}}}')
    assert by_dict == by_text and hash(by_dict) == hash(by_text)
    # Key order is kept: it is the order of the properties in the output.
    assert by_dict.spec_key() == ("json", '{"type":"object","properties":{"b":{},"a":{}}}')
    assert by_dict != StructuredOutputsParams(
        json={"type": "object", "properties": {"a": {}, "b": {}}}
    )
    assert StructuredOutputsParams(regex="[0-9]+").spec_key() == ("regex", "[0-9]+")
    assert StructuredOutputsParams(choice=("a", 'b"')).spec_key() == ("choice", '["a", "b\\""]')
    assert StructuredOutputsParams(grammar='start: "x"').kind == "grammar"
    assert StructuredOutputsParams(json_object=True).spec_key() == ("json_object", "")
    assert isinstance(by_dict.spec_key(), StructuredOutputSpec)
    assert len({by_dict, by_text, StructuredOutputsParams(regex="a")}) == 2


def test_pydantic_model_class_gives_its_schema():
    params = StructuredOutputsParams(json=Person)
    assert params == StructuredOutputsParams(json=Person.model_json_schema())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one of .*got none"),
        ({"json_object": False}, "got none"),
        ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
        ({"json": "{not json"}, "json schema is not valid JSON"),
        ({"json": "[1, 2]"}, "must be a JSON object"),
        ({"json": {"x": float("nan")}}, "not serializable"),
        ({"choice": []}, "at least one string"),
        ({"grammar": "  "}, "grammar must not be empty"),
    ],
)
def test_invalid_params_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StructuredOutputsParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"regex": 3}, "regex must be a str, got int"),
        ({"grammar": b"x"}, "grammar must be a str"),
        ({"choice": "abc"}, "choice must be a list of strings, got str"),
        ({"choice": ["a", 1]}, "1 is not a string"),
        ({"json": 5}, "got int"),
        ({"json": int}, "int has no model_json_schema"),
        ({"json_object": "yes"}, "json_object must be a bool"),
    ],
)
def test_wrong_types_raise_type_error(kwargs, match):
    with pytest.raises(TypeError, match=match):
        StructuredOutputsParams(**kwargs)


def test_frozen():
    params = StructuredOutputsParams(regex="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.regex = "b"  # type: ignore[misc]


def test_pickles_with_its_key():
    params = StructuredOutputsParams(json=Person)
    copy = pickle.loads(pickle.dumps(params))
    assert copy == params and copy.spec_key() == params.spec_key() and copy.json is Person


def test_disable_any_whitespace_is_in_the_spec_key() -> None:
    """vLLM's option, held as llguidance's x-guidance in the schema text: equal to asking
    for it in the schema, different from the default (flexible whitespace)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    compact = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    in_schema = StructuredOutputsParams(
        json={**schema, "x-guidance": {"whitespace_flexible": False}}
    )
    assert compact == in_schema
    assert compact != StructuredOutputsParams(json=schema)
    assert "x-guidance" not in StructuredOutputsParams(json=schema).spec_key().text
    with pytest.raises(ValueError, match="json only"):
        StructuredOutputsParams(regex="a+", disable_any_whitespace=True)
    with pytest.raises(TypeError, match="bool"):
        StructuredOutputsParams(json=schema, disable_any_whitespace="yes")
    with pytest.raises(ValueError, match="x-guidance"):
        StructuredOutputsParams(json={**schema, "x-guidance": 1}, disable_any_whitespace=True)
