"""Qwen3.5's tool calls through the real server: the tiny random Qwen3.5 (hybrid) served with
`--enable-auto-tool-choice --tool-call-parser qwen3_coder --reasoning-parser qwen3`, the
official openai client on loopback. A regex makes the random model write the XML call a
Qwen3.5 checkpoint writes; the parser turns it into OpenAI's call, its values typed by the
tool's schema (`days` an integer), the same whole and streamed."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.entrypoints.conftest import MODEL_NAME, WEATHER_PARAMS, Server
from tests.entrypoints.openai.test_server_structured import collect_stream

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}}]
MESSAGES = [{"role": "user", "content": "What is the weather?"}]
XML_CALL = (
    r"<tool_call>\n<function=get_weather>\n<parameter=city>\n(Paris|Oslo)\n</parameter>\n"
    r"<parameter=days>\n[1-7]\n</parameter>\n</function>\n</tool_call>"
)


@pytest.fixture(scope="module")
def client(tiny_qwen3_5_dir: str, tmp_path_factory: pytest.TempPathFactory):
    log = str(tmp_path_factory.mktemp("serve-qwen3-xml") / "server.log")
    flags = ("--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder")
    srv = Server(tiny_qwen3_5_dir, log, *flags, "--reasoning-parser", "qwen3")
    yield openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
    srv.stop()


def chat(client: openai.OpenAI, regex: str, stream: bool):
    """(reasoning, content, [(name, arguments)], finish reason) of a greedy request whose
    output the regex fixes, read whole or added up from the stream as a client does."""
    response = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=160,
        temperature=0,
        stream=stream,
        extra_body={"guided_regex": regex, "chat_template_kwargs": {"enable_thinking": False}},
    )
    if stream:
        out, finish = collect_stream(response)
        calls = [(c["name"], c["arguments"]) for c in out["calls"].values()]
        return out["reasoning"], out["content"], calls, finish
    choice = response.choices[0]
    message = choice.message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    reasoning = (message.model_extra or {}).get("reasoning") or ""
    return reasoning, message.content or "", calls, choice.finish_reason


def test_an_xml_call_becomes_a_typed_tool_call_whole_and_streamed(client):
    whole = chat(client, r"Sure\.\n" + XML_CALL, stream=False)
    _, content, calls, finish = whole
    assert content == "Sure.\n" and finish == "tool_calls"
    assert [name for name, _ in calls] == ["get_weather"]
    arguments = json.loads(calls[0][1])
    jsonschema.validate(arguments, WEATHER_PARAMS)  # days an integer, not "3"
    assert chat(client, r"Sure\.\n" + XML_CALL, stream=True) == whole


def test_a_call_inside_the_thinking_ends_it(client):
    regex = r"<think>\nhm\.\n" + XML_CALL  # the think block never closed
    for stream in (False, True):
        reasoning, _, calls, finish = chat(client, regex, stream)
        assert reasoning.strip() == "hm." and "<tool_call>" not in reasoning
        assert finish == "tool_calls" and [name for name, _ in calls] == ["get_weather"]
        jsonschema.validate(json.loads(calls[0][1]), WEATHER_PARAMS)
