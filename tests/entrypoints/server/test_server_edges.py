"""Malformed or hostile requests on the chat, Responses and Messages APIs, through the real
server and the official openai and anthropic clients: a clean 4xx in each API's own shape,
naming the field; what the grammar engine cannot honour refused before the 200."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from minivllm.entrypoints.server.path_errors import error_for_path
from tests.entrypoints.conftest import API_KEY, MODEL_NAME

BAD_DEFS = [{"type": "object", "properties": {}, "$defs": bad} for bad in ("x", 3, None)]
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)


@pytest.mark.parametrize("schema", BAD_DEFS)
def test_a_tool_schema_with_non_object_defs_is_a_400(client, claude, schema):
    chat_tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    with pytest.raises(openai.BadRequestError, match=r"\$defs must be an object") as info:
        client.chat.completions.create(
            model=MODEL_NAME, messages=USER, tools=chat_tools, tool_choice="required"
        )
    assert info.value.body["param"] == "tools"
    flat = [{"type": "function", "name": "f", "parameters": schema}]
    with pytest.raises(openai.BadRequestError, match=r"\$defs must be an object"):
        client.responses.create(model=MODEL_NAME, input="hi", tools=flat, tool_choice="required")
    with pytest.raises(anthropic.BadRequestError, match=r"\$defs must be an object") as error:
        claude.messages.create(
            model=MODEL_NAME, max_tokens=4, messages=USER,
            tools=[{"name": "f", "input_schema": schema}], tool_choice={"type": "any"},
        )  # fmt: skip
    assert error.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "extra",
    [
        {"structured_outputs": {"regex": "a{1000}{1000}"}},
        {"structured_outputs": {"json": {"type": "object", "properties": {
            "a": {"type": "string", "pattern": "^a{1000}{1000}$"}}, "required": ["a"]}}},
    ],
)  # fmt: skip
def test_constraints_past_the_engines_limits_are_400s(client, extra):
    with pytest.raises(openai.BadRequestError, match="beyond the grammar engine's limits"):
        client.chat.completions.create(model=MODEL_NAME, messages=USER, extra_body=extra)


def test_many_tools_under_required_are_refused_naming_the_limit(client, claude):
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}}}}
        for i in range(2100)
    ]  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="grammar engine's limit"):
        client.chat.completions.create(
            model=MODEL_NAME, messages=USER, tools=tools, tool_choice="required"
        )


def test_a_choice_of_2100_options_is_followed(client):
    options = [f"option {i}" for i in range(2100)]
    for seed in range(3):
        answer = client.chat.completions.create(
            model=MODEL_NAME, messages=USER, max_tokens=16, seed=seed, temperature=1.0,
            extra_body={"structured_outputs": {"choice": options}},
        )  # fmt: skip
        assert answer.choices[0].finish_reason == "stop"
        assert answer.choices[0].message.content in options


def test_ignore_eos_holds_under_a_grammar_that_may_end(client):
    for seed in range(6):
        answer = client.completions.create(
            model=MODEL_NAME, prompt="a", max_tokens=20, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"grammar": "start: /[ab]+/"}, "ignore_eos": True},
        )  # fmt: skip
        choice = answer.choices[0]
        assert choice.finish_reason == "length", choice
        assert answer.usage.completion_tokens == 20
        assert set(choice.text) <= {"a", "b"}


def test_middleware_errors_on_messages_are_anthropics(server, claude):
    wrong = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as error:
        wrong.messages.create(model=MODEL_NAME, max_tokens=4, messages=USER)
    assert error.value.body["type"] == "error"
    assert error.value.body["error"]["type"] == "authentication_error"
    big = {"model": MODEL_NAME, "max_tokens": 4, "messages": USER, "pad": "x" * (9 << 20)}
    status, body = server.request(
        "POST", "/v1/messages", json.dumps(big), {"x-api-key": API_KEY}, timeout=120
    )
    assert status == 413 and body["type"] == "error"
    assert body["error"]["type"] == "request_too_large"
    # The same middleware answers in OpenAI's shape elsewhere.
    status, body = server.request("POST", "/v1/chat/completions", {}, {"x-api-key": "wrong"})
    assert status == 401 and body["error"]["type"] == "AuthenticationError"


def test_max_output_tokens_zero_names_the_field(client):
    with pytest.raises(openai.BadRequestError, match="max_output_tokens must be at least 1") as e:
        client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=0)
    assert e.value.body["param"] == "max_output_tokens"


def test_a_huge_previous_response_id_is_not_echoed(server, auth):
    body = {"model": MODEL_NAME, "input": "hi", "previous_response_id": "r" * 1_000_000}
    status, answer = server.request("POST", "/v1/responses", body, auth)
    assert status == 404 and len(answer["error"]["message"]) < 400


def test_deeply_nested_arguments_are_a_400_naming_the_field(client):
    deep = "[" * 100_000 + "]" * 100_000
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]  # fmt: skip
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\].tool_calls: .*too deeply"):
        client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=2)


def test_responses_take_an_empty_tools_list(client):
    answer = client.responses.create(model=MODEL_NAME, input="hi", tools=[], max_output_tokens=2)
    assert answer.status == "incomplete"


def test_cut_off_arguments_sent_back_are_taken_as_text(client):
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": '{"a": 1, "b'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]  # fmt: skip
    answer = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=2)
    assert answer.choices[0].finish_reason == "length"


def test_integral_decimal_counts_in_a_schema_are_accepted(client):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "minLength": 2.0, "maxLength": 4.0}},
        "required": ["a"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    answer = client.chat.completions.create(
        model=MODEL_NAME, messages=USER, response_format=fmt, max_tokens=32, seed=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    if answer.choices[0].finish_reason == "stop":
        assert 2 <= len(json.loads(answer.choices[0].message.content)["a"]) <= 4


def test_the_generic_500_on_messages_is_anthropics():
    # What the app's last-resort handler sends (no request reaches it on purpose any more).
    body = json.loads(error_for_path("/v1/messages", "internal error: KeyError", 500).body)
    assert body == {"type": "error", "error": {"type": "api_error", "message": body["error"][
        "message"]}}  # fmt: skip
    assert json.loads(error_for_path("/v1/messages/count_tokens", "x", 401).body)["type"] == "error"
    assert json.loads(error_for_path("/v1/messagesx", "x", 500).body)["error"]["code"] == 500
    assert json.loads(error_for_path("/v1/chat/completions", "x", 500).body)["error"]["code"] == 500
