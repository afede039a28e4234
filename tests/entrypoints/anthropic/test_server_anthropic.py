"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the real
server over raw HTTP, on the tiny random model with a chat template that writes tools, calls
and tool results: each answer equals the chat completion it is served as (greedy), streamed
events add up to the whole answer, forced tool calls validate, and errors come in Anthropic's
shape. The event and block mapping itself is checked on hand-made parser output."""

from __future__ import annotations

import json

import jsonschema
import pytest

from minivllm.entrypoints.anthropic.output import BlockEvents, content_blocks
from tests.entrypoints.conftest import API_KEY, MODEL_NAME, TOOLS_TEMPLATE, WEATHER_PARAMS, Server

PARAMS = WEATHER_PARAMS
TOOLS = [{"name": "get_weather", "description": "The weather", "input_schema": PARAMS}]
CHAT_TOOLS = [
    {"type": "function",
     "function": {"name": "get_weather", "description": "The weather", "parameters": PARAMS}}
]  # fmt: skip
USER = [{"role": "user", "content": "What is the weather?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
KEY = {"x-api-key": API_KEY}  # the Anthropic SDK's header


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory):
    log = str(tmp_path_factory.mktemp("serve-anthropic") / "server.log")
    flags = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    srv = Server(
        tiny_qwen3_dir, log, *flags, "--reasoning-parser", "qwen3", "--chat-template",
        TOOLS_TEMPLATE, "--api-key", API_KEY,
    )  # fmt: skip
    yield srv
    srv.stop()


def message(server: Server, **body) -> tuple[int, dict]:
    body = {"model": MODEL_NAME, "max_tokens": 12, "temperature": 0.0, **NO_THINKING, **body}
    return server.request("POST", "/v1/messages", body, KEY)


def chat(server: Server, **body) -> dict:
    body = {"model": MODEL_NAME, "max_tokens": 12, "temperature": 0.0, **NO_THINKING, **body}
    status, out = server.request(
        "POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {API_KEY}"}
    )
    assert status == 200, out
    return out


def streamed(server: Server, **body) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a streamed answer; each data's type is its event's name."""
    status, text = message(server, stream=True, **body)
    assert status == 200
    events = []
    for chunk in text.strip().split("\n\n"):
        name, data = chunk.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append((event["type"], event))
    return events


def rebuilt(events: list[tuple[str, dict]]) -> dict:
    """The whole answer a client builds from the events (as Anthropic's SDK does)."""
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    answer = events[0][1]["message"]
    partial: dict[int, str] = {}
    for kind, event in events[1:-1]:
        if kind == "content_block_start":
            assert event["index"] == len(answer["content"])
            answer["content"].append(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = answer["content"][event["index"]], event["delta"]
            if delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            else:
                key = {"text_delta": "text", "thinking_delta": "thinking"}[delta["type"]]
                block[key] += delta[key]
        elif kind == "message_delta":
            answer.update(event["delta"])
            answer["usage"]["output_tokens"] = event["usage"]["output_tokens"]
    for index, text in partial.items():
        answer["content"][index]["input"] = json.loads(text)
    return answer


@pytest.mark.parametrize("stream", [False, True])
def test_a_text_answer_is_its_chat_completion(server, stream):
    system = [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]
    body = dict(messages=USER, system=system)
    if stream:
        answer = rebuilt(streamed(server, **body))
    else:
        status, answer = message(server, **body)
        assert status == 200, answer
    ref = chat(server, messages=[{"role": "system", "content": "Be brief."}, *USER])
    choice = ref["choices"][0]
    assert answer["type"] == "message" and answer["role"] == "assistant"
    assert answer["id"].startswith("msg_")
    assert [b["type"] for b in answer["content"]] == ["text"]
    assert answer["content"][0]["text"] == choice["message"]["content"]
    want = {"length": "max_tokens", "stop": "end_turn"}[choice["finish_reason"]]
    assert answer["stop_reason"] == want and answer["stop_sequence"] is None
    assert answer["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    assert answer["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]


def test_a_stop_sequence_is_named(server):
    text = chat(server, messages=USER)["choices"][0]["message"]["content"]
    stop = text[3:6]
    status, answer = message(server, messages=USER, stop_sequences=["zzzz", stop])
    assert status == 200, answer
    assert answer["stop_reason"] == "stop_sequence" and answer["stop_sequence"] == stop
    assert answer["content"][0]["text"] == text[: text.index(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_use_validates_and_round_trips(server, stream):
    body = dict(messages=USER, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=96)
    if stream:
        answer = rebuilt(streamed(server, **body))
    else:
        status, answer = message(server, **body)
        assert status == 200, answer
    assert answer["stop_reason"] == "tool_use"
    uses = answer["content"]
    assert uses and all(b["type"] == "tool_use" and b["name"] == "get_weather" for b in uses)
    for block in uses:
        jsonschema.validate(block["input"], PARAMS)
    # The calls and their results sent back render as chat's assistant calls and tool messages.
    results = [
        {
            "type": "tool_result",
            "tool_use_id": b["id"],
            "content": [{"type": "text", "text": "sun"}],
        }
        for b in uses
    ]
    turns = [*USER, {"role": "assistant", "content": uses}, {"role": "user", "content": results}]
    status, answer = message(server, messages=turns, tools=TOOLS, tool_choice={"type": "none"})
    assert status == 200, answer
    calls = [
        {"id": b["id"], "type": "function",
         "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
        for b in uses
    ]  # fmt: skip
    messages = [*USER, {"role": "assistant", "tool_calls": calls}]
    messages += [{"role": "tool", "tool_call_id": b["id"], "content": "sun"} for b in uses]
    ref = chat(server, messages=messages, tools=CHAT_TOOLS, tool_choice="none")
    assert answer["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    assert answer["content"][0]["text"] == ref["choices"][0]["message"]["content"]
    status, counted = server.request(
        "POST", "/v1/messages/count_tokens", {"model": MODEL_NAME, "messages": turns,
                                              "tools": TOOLS, **NO_THINKING}, KEY,
    )  # fmt: skip
    assert status == 200 and counted == {"input_tokens": ref["usage"]["prompt_tokens"]}


def test_a_named_tool_and_thinking_sent_back(server):
    status, answer = message(server, messages=USER, tools=TOOLS, max_tokens=96,
                             tool_choice={"type": "tool", "name": "get_weather"})  # fmt: skip
    assert status == 200 and [b["name"] for b in answer["content"]] == ["get_weather"]
    jsonschema.validate(answer["content"][0]["input"], PARAMS)

    def count(blocks) -> int:
        turns = [*USER, {"role": "assistant", "content": blocks}, *USER]
        body = {"model": MODEL_NAME, "messages": turns}
        return server.request("POST", "/v1/messages/count_tokens", body, KEY)[1]["input_tokens"]

    text = {"type": "text", "text": "Sunny."}
    thinking = {"type": "thinking", "thinking": "Let me see.", "signature": ""}
    assert count([thinking, text]) > count([text])  # the reasoning reaches the template


def test_blocks_and_events_of_hand_made_parser_output():
    deltas = [
        {"reasoning": "hm"},
        {"reasoning": "m", "content": "Sure"},
        {"content": "."},
        {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    ]  # fmt: skip
    blocks = BlockEvents()
    events = [e for d in deltas for e in blocks.feed(d)] + blocks.finish()
    assert [e["type"] for e in events] == [
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "content_block_start",
        "content_block_delta", "content_block_delta", "content_block_stop",
    ]  # fmt: skip
    assert blocks.called and blocks.num_blocks == 3
    head = [{"type": "message_start", "message": {"content": [], "usage": {}}}]
    answer = rebuilt([(e["type"], e) for e in head + events + [{"type": "message_stop"}]])
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    whole = {"reasoning": "hmm", "content": "Sure.", "tool_calls": [call]}
    assert answer["content"] == content_blocks(whole)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash_20250124"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool"}}, "needs a name"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        ({"messages": [{"role": "system", "content": "x"}]}, "role"),
    ],
)
def test_bad_requests_are_anthropic_400s(server, body, words):
    status, error = message(server, **{"messages": USER, **body})
    assert status == 400, error
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"]


def test_the_api_key_comes_in_either_header(server):
    body = {"model": MODEL_NAME, "max_tokens": 1, "messages": USER}
    assert server.request("POST", "/v1/messages", body, {"x-api-key": "wrong"})[0] == 401
    assert server.request("POST", "/v1/messages", body)[0] == 401
    bearer = {"Authorization": f"Bearer {API_KEY}"}
    assert server.request("POST", "/v1/messages", body, bearer)[0] == 200
    assert server.request("POST", "/v1/models", None, {"x-api-key": API_KEY})[0] != 401


def test_thinking_maps_to_the_template_and_the_budget():
    from minivllm.entrypoints.anthropic.input import chat_request
    from minivllm.entrypoints.anthropic.protocol import MessagesRequest

    def chat_of(thinking: dict) -> object:
        return chat_request(MessagesRequest(max_tokens=50, messages=USER, thinking=thinking))

    enabled = chat_of({"type": "enabled", "budget_tokens": 20})
    assert enabled.thinking_token_budget == 20
    assert enabled.chat_template_kwargs == {"enable_thinking": True}
    disabled = chat_of({"type": "disabled"})
    assert disabled.thinking_token_budget is None
    assert disabled.chat_template_kwargs == {"enable_thinking": False}
