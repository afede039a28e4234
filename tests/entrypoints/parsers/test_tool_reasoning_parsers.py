"""The tool-call and reasoning parsers on hand-written text (no server): whole outputs, and
the same text streamed in pieces split at every point; the forced-call schemas; the chat
template's view of tools and earlier calls."""

from __future__ import annotations

import json

import jsonschema
import pytest

from minivllm.entrypoints.openai.chat.output import (
    ChatOutputSpec,
    ChoiceParser,
    full_message,
    tool_mode,
)
from minivllm.entrypoints.openai.chat.template import _render
from minivllm.entrypoints.openai.constraints import request_constraint, required_tool_schema
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from minivllm.entrypoints.parsers.reasoning import ThinkReasoningStream, prompt_opens_reasoning
from minivllm.entrypoints.parsers.tools.base import StreamDelta, calls_of
from minivllm.entrypoints.parsers.tools.forced import RequiredToolStream, extract_required
from minivllm.entrypoints.parsers.tools.hermes import HermesToolStream, extract_tool_calls
from minivllm.entrypoints.server.errors import APIError

CALLS_TEXT = (
    "Let me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris \\"<tool_call>\\" }", '
    '"days": [1, {"a": 2}]}}\n</tool_call>\n'
    '<tool_call>{"arguments": {"q": "é"}, "name": "search"}</tool_call>\nbye'
)
EXPECTED = [
    ("get_weather", {"city": 'Paris "<tool_call>" }', "days": [1, {"a": 2}]}),
    ("search", {"q": "é"}),
]


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def splits(text: str):
    """The text in two pieces at every point, and in pieces of 1, 2, 3 and 7 characters."""
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    for size in (1, 2, 3, 7):
        yield pieces(text, size)


def accumulate(deltas) -> tuple[str, list[tuple[str, dict]]]:
    content, calls = "", {}
    for delta in deltas:
        content += delta.content
        for d in delta.tool_calls:
            call = calls.setdefault(d["index"], {"name": None, "arguments": ""})
            if "id" in d:
                assert call["name"] is None
                assert d["id"].startswith("chatcmpl-tool-") and d["type"] == "function"
                call["name"] = d["function"]["name"]
            call["arguments"] += d["function"]["arguments"]
    return content, [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]


def test_hermes_whole_output():
    calls, content = extract_tool_calls(CALLS_TEXT)
    assert content == "Let me look.\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == EXPECTED
    assert extract_tool_calls("no calls here") == ([], "no calls here")
    broken = 'x<tool_call>{"name": "f", "arguments": {</tool_call>'
    assert extract_tool_calls(broken) == ([], broken)  # one bad call: all of it is content
    calls, content = extract_tool_calls('<tool_call>{"name": "f", "arguments": {"a": 1}}')
    assert content is None and calls[0].name == "f"  # unterminated, as vLLM's regex takes it


def test_hermes_stream_at_every_split():
    for parts in splits(CALLS_TEXT):
        stream = HermesToolStream()
        deltas = [stream.feed(p) for p in parts] + [stream.finish()]
        content, calls = accumulate(deltas)
        assert content == "Let me look.\n", parts
        assert calls == EXPECTED, parts
        assert stream.num_calls == 2


@pytest.mark.parametrize(
    "text, content, names",
    [
        ("plain text with < and <tool", "plain text with < and <tool", []),
        ('<tool_call>{"name": "f", "arguments": {"a": [1]}}', "", ["f"]),  # cut short
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ],
)
def test_hermes_stream_edges(text, content, names):
    for parts in splits(text):
        stream = HermesToolStream()
        got_content, calls = accumulate([stream.feed(p) for p in parts] + [stream.finish()])
        assert got_content == content
        assert [name for name, _ in calls] == names


def test_required_output_whole_and_streamed():
    text = '[{"name":"get_weather","parameters":{"city":"Oslo"}}, {"name":"f","parameters":{}}]'
    calls = extract_required(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("f", {}),
    ]
    for parts in splits(text):
        stream = RequiredToolStream()
        _, streamed = accumulate([stream.feed(p) for p in parts] + [stream.finish()])
        assert streamed == [("get_weather", {"city": "Oslo"}), ("f", {})]


def test_required_output_cut_short_is_what_its_stream_sent():
    """max_tokens cuts a "required" array: the whole response has the calls its stream sent,
    the last one with its arguments' text up to the cut (the stream cannot take it back)."""
    text = '[{"name":"get_weather","parameters":{"city":"Oslo"}}, {"name":"f","parameters":{"a'
    calls = extract_required(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city":"Oslo"}'),
        ("f", '{"a'),
    ]
    for cut in (text[:12], text[:40]):  # inside the first name; inside its arguments
        whole = [(c.name, c.arguments) for c in extract_required(cut)]
        for parts in splits(cut):
            stream = RequiredToolStream()
            streamed = StreamDelta()
            for delta in [stream.feed(p) for p in parts] + [stream.finish()]:
                streamed.add(delta)
            assert [(c.name, c.arguments) for c in calls_of(streamed)] == whole


def test_required_schema_accepts_calls_and_lifts_defs():
    request = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "a",
                        "parameters": {
                            "type": "object",
                            "properties": {"p": {"$ref": "#/$defs/P"}},
                            "$defs": {"P": {"type": "integer"}},
                        },
                    },
                },
                {"type": "function", "function": {"name": "b"}},
            ],
            "tool_choice": "required",
        }
    )
    mode, schema = tool_mode(request, tool_parser=None)
    assert mode == "required" and schema["$defs"] == {"P": {"type": "integer"}}
    good = [{"name": "a", "parameters": {"p": 3}}, {"name": "b", "parameters": {}}]
    jsonschema.validate(good, schema)
    for bad in ([], [{"name": "a", "parameters": {"p": "x"}}], [{"name": "c", "parameters": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert required_tool_schema(request.tools, parallel_tool_calls=False)["maxItems"] == 1
    name, params = request_constraint(request, schema)
    assert name == "tool_choice" and params.kind == "json"


def test_tool_mode_rules():
    def req(**fields):
        body = {"messages": [{"role": "user", "content": "x"}], **fields}
        return ChatCompletionRequest.model_validate(body)

    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tool_mode(req(), None) == ("none", None)
    assert tool_mode(req(tools=tools, tool_choice="none"), None) == ("none", None)
    assert tool_mode(req(tools=tools), "hermes") == ("auto", None)
    with pytest.raises(APIError, match="--enable-auto-tool-choice"):
        tool_mode(req(tools=tools), None)  # "auto" is the default with tools, as in vLLM
    named = {"type": "function", "function": {"name": "f"}}
    mode, schema = tool_mode(req(tools=tools, tool_choice=named), None)
    assert mode == "named" and schema["type"] == "object"


def test_reasoning_stream_at_every_split():
    text = "<think>\nwhy </thin k> so</think>\n\nThe answer"
    for parts in splits(text):
        parser = ThinkReasoningStream()
        results = [parser.feed(p) for p in parts] + [parser.finish()]
        assert "".join(r for r, _ in results) == "\nwhy </thin k> so"
        assert "".join(c for _, c in results) == "\n\nThe answer"
    for text, opened, reasoning, content in [
        ("no think here", False, "", "no think here"),
        ("<think>cut short", False, "cut short", ""),  # never closed: all reasoning
        ("<thin", False, "", "<thin"),
        ("opened by the prompt</think>ok", True, "opened by the prompt", "ok"),
    ]:
        parser = ThinkReasoningStream(opened)
        results = [parser.feed(text), parser.finish()]
        assert ("".join(r for r, _ in results), "".join(c for _, c in results)) == (
            reasoning,
            content,
        )
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<think>a</think> then <|im_start|>assistant\n")


def test_reasoning_then_tool_calls_stream_and_full_agree():
    spec = ChatOutputSpec(tool_mode="auto", tool_parser="hermes", reasoning_parser="qwen3")
    text = "<think>plan</think>" + CALLS_TEXT
    message, finish = full_message(spec, text, "stop")
    assert message["reasoning"] == message["reasoning_content"] == "plan"
    assert message["content"] == "Let me look.\n" and finish == "tool_calls"
    full_calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]
    assert full_calls == EXPECTED
    for size in (1, 4, 9):
        parser = ChoiceParser(spec)
        parts = pieces(text, size)
        fields = [parser.feed(p, final=i == len(parts) - 1) for i, p in enumerate(parts)]
        assert "".join(f.get("reasoning", "") for f in fields) == "plan"
        assert "".join(f.get("content", "") for f in fields) == "Let me look.\n"
        calls: dict[int, str] = {}
        for f in fields:
            for d in f.get("tool_calls", []):
                calls[d["index"]] = calls.get(d["index"], "") + d["function"]["arguments"]
        assert [json.loads(a) for a in calls.values()] == [args for _, args in EXPECTED]
        assert parser.finish_reason("stop") == "tool_calls"
        assert parser.finish_reason("length") == "length"


def test_template_sees_tools_and_earlier_calls(tiny_qwen3_dir):
    from minivllm.tokenizer import load_tokenizer

    template = (
        "{{ tools | tojson }}|{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments.city }}]"
        "{% endfor %}{{ m.tool_call_id or '' }}{{ m.reasoning_content or '' }};{% endfor %}"
    )
    messages = [
        ChatMessage(role="user", content="hi"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "reasoning": "think",
                "tool_calls": [
                    {"id": "c1", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}
                ],
            }
        ),
        ChatMessage(role="tool", content="sunny", tool_call_id="c1"),
    ]
    tools = [{"type": "function", "function": {"name": "w"}}]
    text = _render(
        load_tokenizer(tiny_qwen3_dir),
        messages,
        chat_template=template,
        tools=tools,
    )
    assert text.startswith(json.dumps(tools))
    assert "user:hi;assistant:[w Oslo]think;tool:sunnyc1;" in text


def test_auto_without_parallel_tool_calls_keeps_the_first():
    spec = ChatOutputSpec(tool_mode="auto", tool_parser="hermes", parallel_tool_calls=False)
    message, finish = full_message(spec, CALLS_TEXT, "stop")
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    fields = ChoiceParser(spec).feed(CALLS_TEXT, final=True)
    assert {d["index"] for d in fields["tool_calls"]} == {0} and finish == "tool_calls"
