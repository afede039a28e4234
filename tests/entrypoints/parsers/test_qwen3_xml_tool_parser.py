"""The qwen3_coder (qwen3_xml) tool-call parser: Qwen3-Coder's and Qwen3.5's XML calls. Each
text is parsed whole and streamed in pieces cut at every point; both give the same content, the
same calls and the same argument text, and the arguments are the values the tool's schema asks
for (checked with jsonschema)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.entrypoints.openai.chat.output import ChatOutputSpec, ChoiceParser, full_message
from minivllm.entrypoints.parsers.tools import TOOL_PARSERS
from minivllm.entrypoints.parsers.tools.schema_values import coerce

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "scale": {"type": "number"},
        "metric": {"type": "boolean"},
        "where": {"type": "object"},
        "hours": {"type": "array", "items": {"type": "integer"}},
        "note": {"type": ["string", "null"]},
    },
    "required": ["city", "days"],
}
SCHEMAS = {"get_weather": WEATHER, "search": {"type": "object", "properties": {}}}


def call(name: str, *params: tuple[str, str]) -> str:
    """A call as Qwen3.5's chat template lays it out (a newline around each value)."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CODE = 'def f(x):\n    return "<b>" + x  # </p>\n\n'
TWO_CALLS = (
    "I'll check both.\n\n"
    + call(
        "get_weather",
        ("city", 'Paris "Île" \\ é'),
        ("days", "3"),
        ("scale", "1.5"),
        ("metric", "True"),
        ("where", "{'lat': 48.8, 'alt': None}"),
        ("hours", "[1, 2]"),
        ("note", "null"),
    )
    + "\n"
    + call("search", ("q", CODE), ("limit", "10"))
    + "\ntext after the calls"
)
TWO_CALLS_EXPECTED = [
    (
        "get_weather",
        {
            "city": 'Paris "Île" \\ é',
            "days": 3,
            "scale": 1.5,
            "metric": True,
            "where": {"lat": 48.8, "alt": None},
            "hours": [1, 2],
            "note": None,
        },
    ),
    # search names no properties: its values stay strings; the code keeps its own newlines
    # (one newline on each side is the layout's).
    ("search", {"q": CODE, "limit": "10"}),
]

JSON_BLOCK = '<tool_call>\n{"name": "search"}\n</tool_call>'  # Hermes' format: not this one
CASES = [
    # (text, content, [(name, arguments)])
    (TWO_CALLS, "I'll check both.\n\n", TWO_CALLS_EXPECTED),
    ("no call at all", "no call at all", []),
    # A bare <function=, no <tool_call>: a call; a value the model never closed ends at the
    # next parameter, the function's end, or the output's.
    (
        "x <function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>",
        "x ",
        [("get_weather", {"city": "Oslo", "days": 2})],
    ),
    ("<tool_call>\n<function=get_weather>\n<parameter=days>\n4", None,
     [("get_weather", {"days": 4})]),  # fmt: skip
    # No parameters; two functions in one block.
    ("<tool_call><function=search></function><function=search>\n</function></tool_call>",
     None, [("search", {}), ("search", {})]),  # fmt: skip
    # A value of the wrong type stays the model's text (the client sees what it wrote).
    (call("get_weather", ("days", "three"), ("metric", "yes")), None,
     [("get_weather", {"days": "three", "metric": "yes"})]),  # fmt: skip
    # A block with no function in it, or a function name never closed: content.
    (JSON_BLOCK, JSON_BLOCK, []),
    ("see <tool_call>\n<function=sea", "see <tool_call>\n<function=sea", []),
    ("<function=\n<tool_call>\n<function=f>\n</function>", "<function=\n", [("f", {})]),
]  # fmt: skip


def splits(text: str):
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    for size in (1, 2, 3, 7):
        yield [text[i : i + size] for i in range(0, len(text), size)]


def streamed(parts: list[str]) -> tuple[str, list[tuple[str, str]], int]:
    stream = TOOL_PARSERS["qwen3_coder"][1](SCHEMAS)
    content, calls = "", {}
    for delta in [stream.feed(p) for p in parts] + [stream.finish()]:
        content += delta.content
        for d in delta.tool_calls:
            if "id" in d:
                assert d["index"] not in calls and d["id"].startswith("chatcmpl-tool-")
                calls[d["index"]] = [d["function"]["name"], ""]
            calls[d["index"]][1] += d["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)], stream.num_calls


@pytest.mark.parametrize("text,content,expected", CASES)
def test_whole_and_streamed_at_every_split_agree(text, content, expected):
    calls, whole_content = TOOL_PARSERS["qwen3_coder"][0](text, SCHEMAS)
    assert whole_content == content
    got = [(c.name, json.loads(c.arguments)) for c in calls]
    assert got == expected
    arguments = [(c.name, c.arguments) for c in calls]
    for parts in splits(text):
        assert streamed(parts) == ((content or ""), arguments, len(expected)), parts


def test_typed_arguments_validate_against_the_tool_schema():
    calls, _ = TOOL_PARSERS["qwen3_xml"][0](TWO_CALLS, SCHEMAS)
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    # The argument text is JSON with the values in the model's order.
    assert calls[0].arguments.startswith('{"city": "Paris \\"Île\\" \\\\ é", "days": 3, ')


def test_a_string_value_streams_as_it_comes():
    stream = TOOL_PARSERS["qwen3_coder"][1](SCHEMAS)
    head = stream.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan")
    assert head.tool_calls[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"]["arguments"] for d in head.tool_calls) == '{"city": "San'
    # A typed value waits for its end; the newline before </parameter> is held back.
    more = stream.feed(" Jose\n</parameter>\n<parameter=days>\n1")
    assert "".join(d["function"]["arguments"] for d in more.tool_calls) == ' Jose"'
    end = stream.feed("4\n</parameter>\n</function>")
    assert "".join(d["function"]["arguments"] for d in end.tool_calls) == ', "days": 14}'


@pytest.mark.parametrize(
    "text,schema,value",
    [
        ("7", {"type": "integer"}, 7),
        ("7.0", {"type": "integer"}, "7.0"),
        ("7", {"type": "number"}, 7),
        ("-2.5e3", {"type": "number"}, -2500.0),
        ("FALSE", {"type": "boolean"}, False),
        ("null", {"type": ["integer", "null"]}, None),
        ("null", {"type": "string"}, "null"),
        ("3", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 3),
        ('{"a": 1}', {"type": "object"}, {"a": 1}),
        ("[1, 'x']", {"type": "array"}, [1, "x"]),
        ("[1]", {"type": "object"}, "[1]"),
        ("{1, 2}", {"type": "array"}, "{1, 2}"),  # a Python set is no JSON value
        ("NaN", {"type": "number"}, "NaN"),  # nor are NaN and the infinities
        ("1e999", {"type": "number"}, "1e999"),
        ("[1e999]", {"type": "array"}, "[1e999]"),
        ("[Infinity]", {"type": "array"}, "[Infinity]"),
        (" 42 ", None, " 42 "),  # no schema: the text
    ],
)
def test_coerce(text, schema, value):
    assert coerce(text, schema) == value


def test_a_call_while_thinking_ends_the_reasoning():
    """Qwen3.5's template opens <think> in the prompt; a call before </think> is still a
    call (the reasoning parser stops at the parser's marker), whole and streamed."""
    text = "Let me see.\n" + call("get_weather", ("city", "Oslo"), ("days", "2"))
    spec = ChatOutputSpec(
        tool_mode="auto",
        tool_parser="qwen3_coder",
        reasoning_parser="qwen3",
        prompt_opens_reasoning=True,
        reasoning_call_marker="<tool_call>",
        tool_schemas=SCHEMAS,
    )
    message, finish = full_message(spec, text, "stop")
    assert finish == "tool_calls" and message["reasoning"] == "Let me see.\n"
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [
        '{"city": "Oslo", "days": 2}'
    ]
    parser = ChoiceParser(spec)
    pieces = range(0, len(text), 5)
    fields = [parser.feed(text[i : i + 5], final=i + 5 >= len(text)) for i in pieces]
    arguments = "".join(c["function"]["arguments"] for f in fields for c in f.get("tool_calls", []))
    assert arguments == '{"city": "Oslo", "days": 2}'
    assert parser.finish_reason("stop") == "tool_calls"


# Text made of the format's tags, layout and a few characters: every way a model can get the
# format wrong comes out of these.
PIECES = [
    "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
    "get_weather", "days", "city", "note", ">", "<", "\n", "3", "x", '"', "\\", "é", " ",
]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), max_size=30), st.integers(0, 400), st.integers(1, 9))
def test_any_text_parses_the_same_whole_and_streamed(pieces, cut, size):
    text = "".join(pieces)
    calls, content = TOOL_PARSERS["qwen3_coder"][0](text, SCHEMAS)
    for call in calls:
        json.loads(call.arguments)  # always JSON
    arguments = [(c.name, c.arguments) for c in calls]
    cut = min(cut, len(text))
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    for parts in ([text[:cut], text[cut:]], chunks):
        stream_content, stream_arguments, num_calls = streamed(parts)
        # Whole, blank content before calls is None; streamed, it went out as it came.
        assert stream_content == content or (content is None and not stream_content.strip())
        assert (stream_arguments, num_calls) == (arguments, len(calls))
