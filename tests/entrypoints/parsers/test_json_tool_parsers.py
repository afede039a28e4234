"""Bare JSON tool calls: the llama3_json parser, and hermes on an output with no tags. Each
text is parsed whole and streamed in pieces cut at every point; the two agree exactly (the
same content, the same calls, the same argument text)."""

from __future__ import annotations

import json

import pytest

from minivllm.entrypoints.openai.chat.output import (
    ChatOutputSpec,
    ChoiceParser,
    full_message,
    one_delta_per_call,
)
from minivllm.entrypoints.parsers.tools import TOOL_PARSERS
from minivllm.entrypoints.parsers.tools.base import arguments_delta, header_delta
from minivllm.entrypoints.parsers.tools.forced import RequiredToolStream, extract_required
from minivllm.entrypoints.parsers.tools.json_calls import header_verdict

WEATHER_ARGS = '{"city": "Oslo", "days": [1, {"a": "}"}]}'
WEATHER = '{"name": "get_weather", "parameters": ' + WEATHER_ARGS + "}"
SEARCH_ARGS = '{"q":"é \\"x\\""}'
SEARCH = '{"name":"search","arguments":' + SEARCH_ARGS + "}"


def splits(text: str):
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    for size in (1, 3, 7):
        yield [text[i : i + size] for i in range(0, len(text), size)]


def streamed(parser: str, parts: list[str]) -> tuple[str, list[tuple[str, str]], int]:
    """(content, [(name, arguments text)], num_calls) as a client adds up the deltas."""
    stream = TOOL_PARSERS[parser][1]()
    content, calls = "", {}
    for delta in [stream.feed(p) for p in parts] + [stream.finish()]:
        content += delta.content
        for d in delta.tool_calls:
            if "id" in d:  # a call's first delta: its id and name, once
                assert d["index"] not in calls and d["type"] == "function"
                calls[d["index"]] = [d["function"]["name"], ""]
            calls[d["index"]][1] += d["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)], stream.num_calls


def whole(parser: str, text: str) -> tuple[str | None, list[tuple[str, str]]]:
    calls, content = TOOL_PARSERS[parser][0](text)
    return content, [(c.name, c.arguments) for c in calls]


LLAMA_CASES = [
    # (text, content, calls)
    (
        f"<|python_tag|>{WEATHER}; {SEARCH}",
        None,
        [("get_weather", WEATHER_ARGS), ("search", SEARCH_ARGS)],
    ),
    (f"\n {WEATHER}\n", None, [("get_weather", WEATHER_ARGS)]),
    (f"{SEARCH} and then some text", None, [("search", SEARCH_ARGS)]),
    ('{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON, but no call
    ("The weather is fine.", "The weather is fine.", []),
    (f"Sure: {WEATHER}", f"Sure: {WEATHER}", []),  # calls start the output, or none
    ("<|python_tag", "<|python_tag", []),
    ("", "", []),
]


@pytest.mark.parametrize("text, content, calls", LLAMA_CASES)
def test_llama3_json_whole_and_streamed(text, content, calls):
    assert whole("llama3_json", text) == (content, calls)
    for parts in splits(text):
        assert streamed("llama3_json", parts) == (content or "", calls, len(calls)), parts


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_a_bare_json_call_is_a_call(parser):
    text = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
    expected = [("get_weather", '{"city": "Paris", "days": 3}')]
    assert whole(parser, text) == (None, expected)
    for parts in splits(text):
        assert streamed(parser, parts) == ("", expected, 1), parts
    message, finish = full_message(ChatOutputSpec("auto", parser), text, "stop")
    assert finish == "tool_calls" and message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris",
        "days": 3,
    }


@pytest.mark.parametrize("text", ['{"answer": 42}', '  {"name": 3}', "{}"])
def test_hermes_json_that_is_no_call_is_content(text):
    assert whole("hermes", text) == (text, [])
    for parts in splits(text):
        assert streamed("hermes", parts) == (text, [], 0), parts


def test_a_cut_short_call():
    text = '{"name": "get_weather", "parameters": {"city": "Os'
    assert whole("llama3_json", text) == (text, [])  # not JSON: the text, as vLLM
    content, calls, num_calls = streamed("llama3_json", [text])
    assert (content, num_calls) == ("", 1) and calls == [("get_weather", '{"city": "Os')]


@pytest.mark.parametrize(
    "text, verdict",
    [
        ('{"name": "f", "arguments":', True),
        (' { "name" : "a\\"b" , "parameters" :', True),
        ('{"name": "f", "argu', None),
        ('{"na', None),
        ("", None),
        ('{"name": "f", "args":', False),
        ('{"city"', False),
        ("[", False),
    ],
)
def test_header_verdict(text, verdict):
    assert header_verdict(text) is verdict


def test_forced_calls_stream_the_exact_text_of_the_whole_result():
    # Compact JSON, as the grammar writes it: the whole result keeps the model's own text.
    text = (
        '[{"name":"get_weather","parameters":{"city":"Oslo","days":2}},'
        '{"name":"f","parameters":{}}]'
    )
    calls = [(c.name, c.arguments) for c in extract_required(text)]
    assert calls == [("get_weather", '{"city":"Oslo","days":2}'), ("f", "{}")]
    for parts in splits(text):
        stream = RequiredToolStream()
        deltas = [stream.feed(p) for p in parts] + [stream.finish()]
        got = {}
        for delta in deltas:
            for d in delta.tool_calls:
                got.setdefault(d["index"], [d["function"].get("name"), ""])[1] += d["function"][
                    "arguments"
                ]
        assert [tuple(got[i]) for i in sorted(got)] == calls, parts
    spec = ChatOutputSpec("named", tool_name="get_weather")
    arguments = '{"city":"Oslo","days":2}'
    message, _ = full_message(spec, arguments, "stop")
    parser = ChoiceParser(spec)
    fields = [parser.feed(p) for p in (arguments[:5], arguments[5:])]
    assert (
        "".join(d["function"]["arguments"] for f in fields for d in f["tool_calls"])
        == (message["tool_calls"][0]["function"]["arguments"])
    )


def test_a_calls_header_and_arguments_go_in_separate_deltas():
    """One piece that opens two calls and carries their arguments (several tokens a step):
    every delta holds at most one part of a call, the content stays in the first, and the
    parts keep their order."""
    head0 = header_delta(0, "id0", "f")
    head1 = header_delta(1, "id1", "g")
    args0, args1, more0 = (
        arguments_delta(0, '{"a": '),
        arguments_delta(1, "{}"),
        arguments_delta(0, "1}"),
    )
    fields = {"content": "x", "tool_calls": [head0, args0, head1, args1, more0]}
    parts = one_delta_per_call(fields)
    assert parts == [
        {"content": "x", "tool_calls": [head0]},
        {"tool_calls": [args0, head1]},
        {"tool_calls": [args1, more0]},
    ]
    assert one_delta_per_call({"content": "y"}) == [{"content": "y"}]
    assert one_delta_per_call({"tool_calls": [args0, args1]}) == [{"tool_calls": [args0, args1]}]
