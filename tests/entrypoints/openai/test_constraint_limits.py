"""A schema the grammar engine would compile for too long (an object of more optional
properties than MAX_OPTIONAL_PROPERTIES) is refused by the server's check of a request's
constraint before anything compiles: a 400 in OpenAI's shape naming the field and the limit,
in well under 50 ms (its compile would take seconds)."""

from __future__ import annotations

import json
import time

import pytest

from minivllm.entrypoints.openai.constraints import request_constraint, required_tool_schema
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest
from minivllm.entrypoints.server.errors import APIError, error_response
from minivllm.structured_output.schema_limits import MAX_OPTIONAL_PROPERTIES

NAMES = [f"p{i}" for i in range(8001)]
# 8,000 optional properties after a required one: about 8 s of llguidance's compile.
HUGE = {"type": "object", "properties": dict.fromkeys(NAMES, {}), "required": NAMES[:1]}
MESSAGES = [{"role": "user", "content": "x"}]


def _refusal(request: ChatCompletionRequest, tool_schema: dict | None = None) -> APIError:
    start = time.perf_counter()
    with pytest.raises(APIError) as info:
        request_constraint(request, tool_schema)
    assert time.perf_counter() - start < 0.05
    return info.value


@pytest.mark.parametrize("field", ["response_format", "guided_json"])
def test_a_schema_past_the_limit_is_a_400_before_it_compiles(field):
    if field == "response_format":
        fmt = {"type": "json_schema", "json_schema": {"name": "huge", "schema": HUGE}}
        body = {"messages": MESSAGES, "response_format": fmt}
    else:
        body = {"messages": MESSAGES, "guided_json": HUGE}
    error = _refusal(ChatCompletionRequest.model_validate(body))
    assert error.status == 400 and error.param == field
    assert f"limit of {MAX_OPTIONAL_PROPERTIES:,} (MAX_OPTIONAL_PROPERTIES" in error.message
    assert "the object at # has 8,000 optional properties" in error.message
    shaped = json.loads(error_response(error).body)["error"]
    assert shaped["param"] == field and shaped["type"] == "BadRequestError"


def test_a_forced_tool_past_the_limit_is_a_400_naming_tool_choice():
    tools = [{"type": "function", "function": {"name": "f", "parameters": HUGE}}]
    body = {"messages": MESSAGES, "tools": tools, "tool_choice": "required"}
    request = ChatCompletionRequest.model_validate(body)
    schema = required_tool_schema(request.tools, parallel_tool_calls=True)
    error = _refusal(request, schema)
    assert error.status == 400 and error.param == "tool_choice"
    assert (
        "8,000 optional properties" in error.message and "MAX_OPTIONAL_PROPERTIES" in error.message
    )
