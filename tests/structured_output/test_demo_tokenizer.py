"""The llguidance backend on the demo model's real vocabulary (SmolLM2, 49152 tokens)."""

from __future__ import annotations

import json
import re

import jsonschema
import pydantic
import pytest

from minivllm.structured_output import StructuredOutputsParams
from tests.structured_output.conftest import generate


class Order(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")  # additionalProperties: false

    item: str = pydantic.Field(max_length=12)
    quantity: int = pydantic.Field(ge=1, le=99)
    express: bool


@pytest.mark.parametrize("seed", range(3))
def test_pydantic_schema_outputs_validate(demo_backend, demo_tokenizer, seed):
    # This vocabulary has hundreds of whitespace tokens, so random logits would mostly write
    # whitespace where the JSON grammar allows it: x-guidance (llguidance's) turns that off.
    schema = {**Order.model_json_schema(), "x-guidance": {"whitespace_flexible": False}}
    text = demo_tokenizer.decode(generate(demo_backend, StructuredOutputsParams(json=schema), seed))
    jsonschema.validate(json.loads(text), Order.model_json_schema())
    Order.model_validate_json(text)


@pytest.mark.parametrize("seed", range(3))
def test_regex_and_choice_outputs_match(demo_backend, demo_tokenizer, seed):
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
    text = demo_tokenizer.decode(generate(demo_backend, StructuredOutputsParams(regex=date), seed))
    assert re.fullmatch(date, text), text
    choices = ["Paris", "London", "New York"]
    params = StructuredOutputsParams(choice=choices)
    assert demo_tokenizer.decode(generate(demo_backend, params, seed, greedy=True)) in choices


def test_real_text_is_accepted(demo_backend, demo_tokenizer):
    grammar = demo_backend.compile(StructuredOutputsParams(json=Order).spec_key())
    matcher = demo_backend.new_matcher(grammar)
    ids = demo_tokenizer.encode('{"item": "apples", "quantity": 3, "express": false}')
    assert matcher.accept_tokens(ids) and matcher.is_accepting()
    assert matcher.accept_tokens([demo_backend.eos_token_ids[0]]) and matcher.is_finished()
