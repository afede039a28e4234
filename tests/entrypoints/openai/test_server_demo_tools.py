"""Forced tool calls end to end on the demo model (SmolLM2-135M-Instruct, CPU): the official
openai client against `minivllm serve` on loopback. The arguments parse and validate against
the tool's parameters; streamed, the name comes first and the arguments in fragments that add
up to exactly the non-streamed result (greedy, so both runs write the same tokens)."""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import openai
import pytest

from minivllm.demo_model import INSTALL_HINT, demo_gguf_file
from tests.entrypoints.conftest import MODEL_NAME, Server

CITY = {"type": "string", "maxLength": 24}
PARAMS = {
    "get_weather": {
        "type": "object",
        "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    "get_time": {
        "type": "object",
        "properties": {"city": CITY},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": PARAMS[name]},
    }
    for name, description in (
        ("get_weather", "The weather forecast for a city"),
        ("get_time", "The local time in a city"),
    )
]
MESSAGES = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    path = demo_gguf_file()
    if path is None or importlib.util.find_spec("gguf") is None:
        pytest.skip(f"the real demo model is not installed ({INSTALL_HINT})")
    srv = Server(path, str(tmp_path_factory.mktemp("serve-demo") / "server.log"))
    yield openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
    srv.stop()


def _forced_request(tool_choice, **options) -> dict:
    """A greedy chat request about MESSAGES with TOOLS, its call forced by tool_choice."""
    return dict(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=tool_choice,
        temperature=0,
        seed=0,
        **options,
    )


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call_streamed_equals_whole(client, tool_choice):
    kwargs = _forced_request(
        tool_choice,
        parallel_tool_calls=False,
        max_tokens=48,
        extra_body={"return_token_ids": True},
    )
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    if tool_choice is NAMED:
        assert call.function.name == "get_weather"

    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    deltas = [d for chunk in chunks for c in chunk.choices for d in c.delta.tool_calls or []]
    first, rest = deltas[0], deltas[1:]
    assert first.id.startswith("chatcmpl-tool-") and first.function.name == call.function.name
    assert not first.function.arguments  # the name first, alone
    assert len(rest) >= 2 and all(d.id is None and d.function.name is None for d in rest)
    assert all(d.index == 0 for d in deltas)
    for chunk in chunks:  # a call's header and arguments never share a chunk (as OpenAI's)
        for c in chunk.choices:
            indexes = [d.index for d in c.delta.tool_calls or []]
            assert len(indexes) == len(set(indexes))
    assert "".join(d.function.arguments for d in rest) == call.function.arguments
    assert not "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
    assert [c.finish_reason for chunk in chunks for c in chunk.choices][-1] == "tool_calls"
    # Every token's id is streamed, also those whose text the call's parser held back (the
    # role's chunk has none).
    streamed_ids = [
        t for chunk in chunks for c in chunk.choices for t in c.model_extra.get("token_ids") or []
    ]
    assert streamed_ids == choice.model_extra["token_ids"]


@pytest.mark.parametrize(
    "tool_choice, max_tokens", [("required", 12), (NAMED, 6)], ids=["required", "named"]
)
def test_forced_call_cut_short_streamed_equals_whole(client, tool_choice, max_tokens):
    """max_tokens ends a forced call inside its arguments: the whole response has the call
    its stream sent, arguments cut where the stream's end, and finish_reason "length"."""
    kwargs = _forced_request(tool_choice, max_tokens=max_tokens)
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name in PARAMS and call.function.arguments.startswith('{"')

    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    deltas = [d for chunk in chunks for c in chunk.choices for d in c.delta.tool_calls or []]
    assert [d.function.name for d in deltas if d.function.name] == [call.function.name]
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [c.finish_reason for chunk in chunks for c in chunk.choices][-1] == "length"


def test_responses_api_answers_calls_and_reads_the_result(client):
    """The Responses API on the demo model: a sensible answer; a required call that validates;
    its output sent back as an item, read in the next answer."""
    answer = client.responses.create(
        model=MODEL_NAME, input="What is the capital of France?", temperature=0,
        max_output_tokens=30,
    )  # fmt: skip
    assert "Paris" in answer.output_text and answer.status == "completed"
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    question = {"role": "user", "content": MESSAGES[0]["content"]}
    called = client.responses.create(
        model=MODEL_NAME, input=[question], tools=tools, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_output_tokens=48,
    )  # fmt: skip
    (call,) = called.output
    assert call.type == "function_call" and call.name in PARAMS
    jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    final = client.responses.create(
        model=MODEL_NAME, previous_response_id=called.id, input=[result], tools=tools,
        tool_choice="none", temperature=0, max_output_tokens=40,
    )  # fmt: skip
    assert "24" in final.output_text or "unny" in final.output_text, final.output_text
