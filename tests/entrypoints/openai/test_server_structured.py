"""Structured outputs, tool calling and reasoning through the real server (the official
openai client, loopback, the tiny random model: its text means nothing, so every check is on
the shape the constraint or the parser guarantees)."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.entrypoints.conftest import MODEL_NAME, WEATHER_PARAMS, Server

# Small, closed schemas: a random model can only finish them by following the mask.
SCHEMA = {**WEATHER_PARAMS, "x-guidance": {"whitespace_flexible": False}}
TOOL_PARAMS = WEATHER_PARAMS
OTHER_PARAMS = {
    "type": "object",
    "properties": {"on": {"type": "boolean"}},
    "required": ["on"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": TOOL_PARAMS}},
    {"type": "function", "function": {"name": "switch", "parameters": OTHER_PARAMS}},
]
PARAMS_OF = {"get_weather": TOOL_PARAMS, "switch": OTHER_PARAMS}
MESSAGES = [{"role": "user", "content": "What is the weather?"}]
HERMES_CALL = (
    r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Oslo)", '
    r'"days": [1-7]\}\}</tool_call>'
)


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory):
    log = str(tmp_path_factory.mktemp("serve-structured") / "server.log")
    flags = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    srv = Server(tiny_qwen3_dir, log, *flags, "--reasoning-parser", "qwen3")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, thinking: bool = False, **kwargs):
    """A chat completion; thinking off unless asked (the server has a reasoning parser, and a
    random model that starts a think block never closes it: its constraint would not start)."""
    kwargs = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 48, "seed": 0, **kwargs}
    if not thinking:
        extra = kwargs["extra_body"] = dict(kwargs.get("extra_body") or {})
        extra["chat_template_kwargs"] = {"enable_thinking": False}
    return client.chat.completions.create(**kwargs)


def collect_stream(stream) -> tuple[dict, str | None]:
    """(content, reasoning, tool calls by index) accumulated as a client would."""
    content = reasoning = ""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning") or ""
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    assert call["id"] is None, "a call's id comes once, in its first delta"
                    call["id"] = tc.id
                    call["name"] = tc.function.name
                call["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return {"content": content, "reasoning": reasoning, "calls": calls}, finish


def check_calls(calls: list[tuple[str, str]]) -> None:
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), PARAMS_OF[name])


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_validates(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    if stream:
        out, finish = collect_stream(chat(client, response_format=fmt, stream=True))
        text = out["content"]
    else:
        choice = chat(client, response_format=fmt).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_is_an_object(client, tiny_qwen3_dir):
    from minivllm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_qwen3_dir)
    # The mask decides where they are allowed; the bias makes the random model close early.
    bias = {str(tokenizer.convert_tokens_to_ids(t)): 100 for t in ("{", "}")}
    choice = chat(client, response_format={"type": "json_object"}, logit_bias=bias).choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)


def test_regex_choice_and_completions(client):
    text = chat(client, extra_body={"guided_regex": "[a-c]{3}-[0-9]"}).choices[0].message.content
    assert re.fullmatch("[a-c]{3}-[0-9]", text)
    choices = ["yes", "no", "maybe"]
    for body in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        assert chat(client, extra_body=body).choices[0].message.content in choices
    out = client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=16, extra_body={"guided_regex": "[xyz]{4}"}
    )
    assert re.fullmatch("[xyz]{4}", out.choices[0].text)
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    out = client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=48, extra_body={"response_format": fmt}
    )
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMA)


def test_disable_any_whitespace_gives_compact_json(client, tiny_qwen3_dir):
    from minivllm.tokenizer import load_tokenizer

    (newline,) = load_tokenizer(tiny_qwen3_dir).encode("\n", add_special_tokens=False)
    bias = {str(newline): 100}  # taken wherever the grammar allows it
    schema = {k: v for k, v in SCHEMA.items() if k != "x-guidance"}  # JSON's any whitespace
    loose = {"structured_outputs": {"json": schema}}
    assert "\n" in chat(client, extra_body=loose, logit_bias=bias).choices[0].message.content
    body = {"structured_outputs": {"json": schema, "disable_any_whitespace": True}}
    choice = chat(client, extra_body=body, logit_bias=bias).choices[0]
    assert choice.finish_reason == "stop"
    value = json.loads(choice.message.content)
    jsonschema.validate(value, SCHEMA)
    assert choice.message.content == json.dumps(value, separators=(",", ":"))


def test_text_format_is_plain(client):
    choice = chat(client, response_format={"type": "text"}, max_tokens=4).choices[0]
    assert choice.finish_reason == "length"


@pytest.mark.parametrize(
    "body, words",
    [
        (
            {"response_format": {"type": "json_object"}, "guided_json": SCHEMA},
            ["response_format", "guided_json"],
        ),
        (
            {"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]},
            ["structured_outputs", "guided_choice"],
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, ["regex", "choice"]),
        ({"structured_outputs": {"whitespace_pattern": " "}}, ["whitespace_pattern"]),
        (
            {"structured_outputs": {"regex": "a", "disable_any_whitespace": True}},
            ["disable_any_whitespace", "regex"],
        ),
        ({"guided_regex": "a(?=b)"}, ["guided_regex"]),
        ({"guided_whitespace_pattern": " "}, ["guided_whitespace_pattern"]),
        ({"guided_grammar": "start: foo"}, ["guided_grammar"]),
        ({"response_format": {"type": "json_schema"}}, ["json_schema"]),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}}, ["x"]),
        ({"tool_choice": "required"}, ["tools"]),
        ({"tools": []}, ["tools"]),
        ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, ["tool_choice"]),
        (  # refused before it compiles (tests/entrypoints/openai/test_constraint_limits.py)
            {"guided_json": {"type": "object", "properties": {f"p{i}": {} for i in range(1001)}}},
            ["guided_json", "1,001 optional properties", "MAX_OPTIONAL_PROPERTIES"],
        ),
    ],
)
def test_bad_constraints_are_400s(client, body, words):
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, max_tokens=4, extra_body=body)
    for word in words:
        assert word in str(info.value)


def test_bad_schema_then_good_request(client):
    bad = {"type": "object", "properties": {"a": {"type": "strin"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}}
    for _ in range(2):  # the failed compile is cached: the same 400, at once
        with pytest.raises(openai.BadRequestError, match="strin"):
            chat(client, response_format=fmt)
    text = chat(client, extra_body={"guided_choice": ["ok"]}).choices[0].message.content
    assert text == "ok"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_forced_tool_calls(client, tool_choice, stream):
    choice_value = tool_choice
    if tool_choice == "named":
        choice_value = {"type": "function", "function": {"name": "switch"}}
    kwargs = dict(tools=TOOLS, tool_choice=choice_value, temperature=1.0, max_tokens=96)
    if stream:
        out, finish = collect_stream(chat(client, stream=True, **kwargs))
        assert out["content"] == ""
        assert all(c["id"] for c in out["calls"].values())
        calls = [(c["name"], c["arguments"]) for c in out["calls"].values()]
    else:
        choice = chat(client, **kwargs).choices[0]
        finish = choice.finish_reason
        assert choice.message.content is None
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert all(c.id.startswith("chatcmpl-tool-") for c in choice.message.tool_calls)
    assert finish == "tool_calls"
    check_calls(calls)
    if tool_choice == "named":
        assert [name for name, _ in calls] == ["switch"]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_call_parsed_from_text(client, stream):
    # The regex makes the random model write a Hermes call; the parser finds it.
    kwargs = dict(tools=TOOLS, extra_body={"guided_regex": r"Sure\." + HERMES_CALL}, max_tokens=128)
    if stream:
        out, finish = collect_stream(chat(client, stream=True, **kwargs))
        content = out["content"]
        calls = [(c["name"], c["arguments"]) for c in out["calls"].values()]
    else:
        choice = chat(client, **kwargs).choices[0]
        content, finish = choice.message.content, choice.finish_reason
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert content == "Sure."
    assert finish == "tool_calls"
    assert len(calls) == 1 and calls[0][0] == "get_weather"
    check_calls(calls)


def test_auto_without_a_call_is_content(client):
    choice = chat(client, tools=TOOLS, extra_body={"guided_regex": "[a-z]{5}"}).choices[0]
    assert re.fullmatch("[a-z]{5}", choice.message.content)
    assert not choice.message.tool_calls and choice.finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_split(client, stream):
    regex = "<think>[a-z]{2,6}</think>[a-z]{2,6}"
    if stream:
        out, finish = collect_stream(chat(client, stream=True, extra_body={"guided_regex": regex}))
        reasoning, content = out["reasoning"], out["content"]
    else:
        message = chat(client, extra_body={"guided_regex": regex}).choices[0].message
        reasoning, content = message.model_extra["reasoning"], message.content
        assert message.model_extra["reasoning_content"] == reasoning
    assert re.fullmatch("[a-z]{2,6}", reasoning) and re.fullmatch("[a-z]{2,6}", content)
    dropped = chat(client, extra_body={"guided_regex": regex, "include_reasoning": False})
    assert "reasoning" not in dropped.choices[0].message.model_extra
    assert re.fullmatch("[a-z]{2,6}", dropped.choices[0].message.content)


def test_thinking_token_budget_ends_the_reasoning(client):
    # Free to think as long as it likes; the budget ends the block after 3 tokens.
    regex = "<think>[a-z]{1,40}</think>[a-z]{2,6}"
    body = {"guided_regex": regex, "thinking_token_budget": 3}
    message = chat(client, extra_body=body, max_tokens=64).choices[0].message
    reasoning = message.model_extra["reasoning"]
    assert re.fullmatch("[a-z]{2,6}", message.content)
    assert 0 < len(reasoning) and len(reasoning) <= 3 * 8  # at most 3 tokens of [a-z]
    unlimited = chat(client, extra_body={"guided_regex": regex}, max_tokens=64).choices[0].message
    # The same greedy thought, cut after its first 3 tokens.
    free = unlimited.model_extra["reasoning"]
    assert free.startswith(reasoning) and len(free) > len(reasoning)


def test_tool_messages_reach_the_template(client):
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    choice = chat(client, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert choice.choices[0].finish_reason == "length"
    # Arguments that are not JSON (a call cut off by max_tokens) reach it as their text, as
    # OpenAI takes any string there; nesting past the recursion limit is a 400 naming them.
    cut = [*messages[:1], {**messages[1], "tool_calls": [{**messages[1]["tool_calls"][0]}]}]
    cut[1]["tool_calls"][0]["function"] = {"name": "f", "arguments": '{"city": "Os'}
    assert chat(client, messages=cut, max_tokens=4).choices[0].finish_reason == "length"
    cut[1]["tool_calls"][0]["function"] = {"name": "f", "arguments": "[" * 10**5 + "]" * 10**5}
    with pytest.raises(openai.BadRequestError, match="arguments are nested too deeply"):
        chat(client, messages=cut, max_tokens=4)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_made_while_thinking_is_not_lost(client, stream):
    regex = r"<think>hm\.\s?" + HERMES_CALL  # the think block never closed
    kwargs = dict(tools=TOOLS, extra_body={"guided_regex": regex}, max_tokens=128)
    if stream:
        out, finish = collect_stream(chat(client, stream=True, **kwargs))
        reasoning = out["reasoning"]
        calls = [(c["name"], c["arguments"]) for c in out["calls"].values()]
    else:
        choice = chat(client, **kwargs).choices[0]
        finish, reasoning = choice.finish_reason, choice.message.model_extra["reasoning"]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert reasoning.startswith("hm.") and "<tool_call>" not in reasoning
    assert finish == "tool_calls" and [name for name, _ in calls] == ["get_weather"]
    check_calls(calls)


@pytest.mark.parametrize(
    "body",
    [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": SCHEMA},
            }
        },
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "switch"}}},
        {"guided_choice": ["yes", "no"]},
    ],
    ids=["json_schema", "required", "named", "choice"],
)
def test_with_thinking_the_constraint_waits_for_the_reasoning(client, tiny_qwen3_dir, body):
    from minivllm.tokenizer import load_tokenizer

    # "<" can only start "<think>": the constraint does not admit it before the reasoning.
    bias = {str(load_tokenizer(tiny_qwen3_dir).convert_tokens_to_ids("<")): 100}
    kwargs = dict(extra_body=body, logit_bias=bias, max_tokens=96)
    thinking = chat(client, thinking=True, **{**kwargs, "max_tokens": 12}).choices[0]
    assert thinking.finish_reason == "length"  # still thinking: free text
    assert thinking.message.model_extra["reasoning"] and not thinking.message.content
    assert not thinking.message.tool_calls
    off = chat(client, **kwargs).choices[0]  # enable_thinking false: constrained at once
    assert "<" not in (off.message.content or "") and not off.message.model_extra.get("reasoning")
    text = off.message.content
    if "tools" in body:
        check_calls([(c.function.name, c.function.arguments) for c in off.message.tool_calls])
    elif "guided_choice" in body:
        assert text in ("yes", "no")
    else:
        jsonschema.validate(json.loads(text), SCHEMA)
