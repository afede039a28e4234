"""A constraint checked while every compile worker is busy: a 503 with Retry-After at once, in
OpenAI's shape and, on the Messages API, in Anthropic's (the refusal itself is the compiler's,
tests/structured_output/test_compiler.py)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from minivllm.entrypoints.anthropic.serving import anthropic_error
from minivllm.entrypoints.openai import constraints
from minivllm.entrypoints.server.errors import APIError, error_response
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.compiler import CompilerBusy
from minivllm.structured_output.params import StructuredOutputsParams


def test_a_busy_compiler_is_a_503_with_retry_after():
    async def busy(params, refuse_when_busy=False):
        assert refuse_when_busy  # the server's check asks to be refused, not queued
        CheckOutcome.of_error(CompilerBusy(2)).raise_error()  # as the core's answer says

    engine = SimpleNamespace(check_grammar=busy)
    constraint = ("response_format", StructuredOutputsParams(regex="a+"))
    with pytest.raises(APIError) as info:
        asyncio.run(constraints.check_constraint(engine, constraint))
    error = info.value
    assert error.status == 503 and error.param == "response_format"
    assert "its 2 workers are compiling" in error.message
    openai_shaped = error_response(error)
    assert openai_shaped.status_code == 503 and openai_shaped.headers["retry-after"] == "1"
    assert json.loads(openai_shaped.body)["error"]["type"] == "ServiceUnavailableError"
    anthropic_shaped = anthropic_error(error)
    assert anthropic_shaped.headers["retry-after"] == "1"
    assert json.loads(anthropic_shaped.body)["error"]["type"] == "overloaded_error"
