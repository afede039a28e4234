"""The Responses API (POST /v1/responses) through the real server with the official openai
client, on the tiny random model: each answer equals the chat completion it is served as
(greedy), streamed events spell out the final response, stored answers continue a
conversation, and what the server cannot honour is a 400 naming the field. The server's chat
template writes tools, calls, tool results and reasoning into the prompt (the tiny model's own
writes only contents), so that a prompt's token count shows what reached it; /tokenize is
checked against it too."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.entrypoints.conftest import MODEL_NAME, TOOLS_TEMPLATE, WEATHER_PARAMS, Server

SCHEMA = {**WEATHER_PARAMS, "x-guidance": {"whitespace_flexible": False}}
TOOL_PARAMS = WEATHER_PARAMS
TOOLS = [{"type": "function", "name": "get_weather", "parameters": TOOL_PARAMS}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_PARAMS}}]
HERMES_CALL = (
    r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Oslo)", '
    r'"days": [1-7]\}\}</tool_call>'
)
# Greedy, no thinking, cut at max tokens: the random model's text is the same in both APIs.
EXTRA = {"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True, "seed": 0}


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory):
    log = str(tmp_path_factory.mktemp("serve-responses") / "server.log")
    flags = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    srv = Server(
        tiny_qwen3_dir,
        log,
        *flags,
        "--reasoning-parser",
        "qwen3",
        "--chat-template",
        TOOLS_TEMPLATE,
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _request(extra: dict | None, kwargs: dict) -> dict:
    return {
        "model": MODEL_NAME,
        "temperature": 0.0,
        **kwargs,
        "extra_body": {**EXTRA, **(extra or {})},
    }


def respond(client: openai.OpenAI, extra: dict | None = None, **kwargs):
    return client.responses.create(**_request(extra, {"max_output_tokens": 12, **kwargs}))


def chat(client: openai.OpenAI, messages: list, extra: dict | None = None, **kwargs):
    return client.chat.completions.create(
        messages=messages, **_request(extra, {"max_tokens": 12, **kwargs})
    )


def streamed(client: openai.OpenAI, extra: dict | None = None, **kwargs):
    """(the events, the final response) of a streamed answer; checks that every item's text
    is its deltas put together and that the events are numbered in order."""
    kwargs = {"max_output_tokens": 12, **kwargs, "stream": True}
    events = list(client.responses.create(**_request(extra, kwargs)))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1].response
    assert events[-1].type == f"response.{final.status}"
    deltas: dict[str, str] = {}
    for e in events:
        if e.type.endswith(".delta"):
            deltas[e.item_id] = deltas.get(e.item_id, "") + e.delta
    for item in final.output:
        if item.type == "function_call":
            assert deltas.get(item.id, "") == item.arguments
        else:
            assert deltas.get(item.id, "") == item.content[0].text
    added = [e.item for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.id for i in added] == [i.id for i in done] == [i.id for i in final.output]
    assert [i.model_dump() for i in done] == [i.model_dump() for i in final.output]
    return events, final


@pytest.mark.parametrize("stream", [False, True])
def test_a_text_answer_is_its_chat_completion(client, stream):
    kwargs = dict(input="Say something.", instructions="Be brief.")
    response = streamed(client, **kwargs)[1] if stream else respond(client, **kwargs)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say something."},
    ]
    ref = chat(client, messages)
    assert response.output_text == ref.choices[0].message.content
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "incomplete"
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == ref.usage.prompt_tokens
    assert (
        response.usage.output_tokens == 12 and response.usage.total_tokens == ref.usage.total_tokens
    )
    assert response.instructions == "Be brief." and response.max_output_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_text_and_a_call_are_three_items(client, stream):
    regex = r"<think>[a-z]{2,6}</think>Sure\." + HERMES_CALL
    kwargs = dict(input="What is the weather?", tools=TOOLS, max_output_tokens=128)
    extra = {"structured_outputs": {"regex": regex}, "ignore_eos": False}
    if stream:
        events, response = streamed(client, extra, **kwargs)
        kinds = [e.type for e in events]
        assert (
            kinds.index("response.reasoning_text.done")
            < kinds.index("response.output_text.delta")
            < kinds.index("response.function_call_arguments.delta")
        )
    else:
        response = respond(client, extra, **kwargs)
    reasoning, message, call = response.output
    assert reasoning.type == "reasoning" and 2 <= len(reasoning.content[0].text) <= 6
    assert message.type == "message" and response.output_text == "Sure."
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), TOOL_PARAMS)
    assert call.call_id.startswith("chatcmpl-tool-") and call.id.startswith("fc_")
    assert (
        response.status == "completed" and response.usage.output_tokens_details.reasoning_tokens > 0
    )


def test_an_answer_sent_back_is_its_assistant_turn(client):
    """Reasoning, text and a call sent back as items (or through previous_response_id) are one
    assistant message with its reasoning, content and call, as chat renders it."""
    regex = r"<think>[a-z]{2,6}</think>Sure\." + HERMES_CALL
    extra = {"structured_outputs": {"regex": regex}, "ignore_eos": False}
    first = respond(client, extra, input="Weather?", tools=TOOLS, max_output_tokens=128)
    reasoning, message, call = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    items = [{"role": "user", "content": "Weather?"}]
    items += [i.model_dump(exclude_none=True) for i in first.output] + [result]
    sent_back = respond(client, input=items, tools=TOOLS, tool_choice="none")
    stored = respond(client, input=[result], tools=TOOLS, tool_choice="none",
                     previous_response_id=first.id)  # fmt: skip
    assistant = {
        "role": "assistant",
        "content": "Sure.",
        "reasoning_content": reasoning.content[0].text,
        "tool_calls": [{"id": call.call_id, "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments}}],
    }  # fmt: skip
    messages = [items[0], assistant, {"role": "tool", "tool_call_id": call.call_id,
                                      "content": "sunny"}]  # fmt: skip
    ref = chat(client, messages, tools=CHAT_TOOLS, tool_choice="none")
    for answer in (sent_back, stored):
        assert answer.usage.input_tokens == ref.usage.prompt_tokens
        assert answer.output_text == ref.choices[0].message.content
    without_reasoning = chat(client, [items[0], {k: v for k, v in assistant.items()
                                                 if k != "reasoning_content"}, messages[2]],
                             tools=CHAT_TOOLS, tool_choice="none")  # fmt: skip
    assert without_reasoning.usage.prompt_tokens < ref.usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_forced_calls_and_their_outputs_round_trip(client, stream):
    kwargs = dict(input="What is the weather?", tools=TOOLS, tool_choice="required",
                  max_output_tokens=96, extra={"ignore_eos": False})  # fmt: skip
    response = streamed(client, **kwargs)[1] if stream else respond(client, **kwargs)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and len(calls) == len(response.output)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), TOOL_PARAMS)
    # The calls and their outputs sent back render as chat's assistant calls and tool messages.
    outputs = [
        {"type": "function_call_output", "call_id": c.call_id, "output": f"sunny {i}"}
        for i, c in enumerate(calls)
    ]
    items = [{"role": "user", "content": "What is the weather?"}]
    items += [c.model_dump(exclude_none=True) for c in calls] + outputs
    answer = respond(client, input=items, tools=TOOLS, tool_choice="none")
    messages = [
        items[0],
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ],  # fmt: skip
        },
        *[{"role": "tool", "tool_call_id": o["call_id"], "content": o["output"]} for o in outputs],
    ]
    ref = chat(client, messages, tools=CHAT_TOOLS, tool_choice="none")
    assert answer.usage.input_tokens == ref.usage.prompt_tokens
    assert answer.output_text == ref.choices[0].message.content


def test_named_tool_choice_and_text_format(client):
    named = respond(client, input="Weather?", tools=TOOLS, max_output_tokens=96,
                    tool_choice={"type": "function", "name": "get_weather"},
                    extra={"ignore_eos": False})  # fmt: skip
    (call,) = named.output
    assert call.name == "get_weather" and named.status == "completed"
    jsonschema.validate(json.loads(call.arguments), TOOL_PARAMS)
    fmt = {"type": "json_schema", "name": "weather", "schema": SCHEMA}
    answer = respond(client, input="Weather?", text={"format": fmt}, max_output_tokens=96,
                     extra={"ignore_eos": False})  # fmt: skip
    jsonschema.validate(json.loads(answer.output_text), SCHEMA)
    assert answer.text.format.type == "json_schema"


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_chats(client, stream):
    kwargs = dict(input="Hi", include=["message.output_text.logprobs"], top_logprobs=2)
    if stream:
        events, response = streamed(client, **kwargs)
        final = [lp.model_dump() for lp in response.output[0].content[0].logprobs]
        deltas = [
            lp.model_dump()
            for e in events
            if e.type == "response.output_text.delta"
            for lp in e.logprobs
        ]
        (done,) = [e for e in events if e.type == "response.output_text.done"]
        assert deltas == [lp.model_dump() for lp in done.logprobs] == final
    else:
        response = respond(client, **kwargs)
    ref = chat(client, [{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=2)
    got = response.output[0].content[0].logprobs
    want = ref.choices[0].logprobs.content
    assert [g.token for g in got] == [w.token for w in want]
    assert [g.logprob for g in got] == pytest.approx([w.logprob for w in want], abs=1e-4)
    assert [len(g.top_logprobs) for g in got] == [2] * 12


def test_previous_response_id_continues_a_stored_conversation(client):
    first = respond(client, input="One.", instructions="Count.")
    assert first.store
    second = respond(client, input="Two.", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # The instructions do not carry over; the first turn's input and answer do.
    items = [
        {"role": "user", "content": "One."},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": "Two."},
    ]  # fmt: skip
    explicit = respond(client, input=items)
    assert second.output_text == explicit.output_text
    assert second.usage.input_tokens == explicit.usage.input_tokens
    third = respond(client, input="Three.", previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError, match=first.id):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        respond(client, input="Two.", previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match="no longer stored"):
        respond(client, input="Four.", previous_response_id=third.id)
    unstored = respond(client, input="One.", store=False)
    assert not unstored.store
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_cache_salt_reaches_the_prefix_cache(client):
    text = "A long enough question to fill several blocks of the prefix cache, twice over."

    def cached(salt: str) -> int:
        response = respond(client, {"cache_salt": salt}, input=text, max_output_tokens=1)
        return response.usage.input_tokens_details.cached_tokens

    assert cached("r-a") == 0 and cached("r-a") > 0 and cached("r-b") == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"tool_choice": {"type": "file_search"}, "tools": TOOLS}, "tool_choice"),
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input[0]"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0]",
        ),  # fmt: skip
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]},
            "input[0]",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0]"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs", "nonsense"]}, "include"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"text": {"verbosity": "high"}}, "verbosity"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 5}, "max_tokens"),
        ({"input": [{"role": "user", "content": "x"}], "messages": []}, "messages"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(server, body, param):
    status, response = server.request(
        "POST", "/v1/responses", {"model": MODEL_NAME, "input": "Hi", **body}
    )
    assert status == 400, response
    assert response["error"]["param"] == param, response


def test_an_unknown_previous_response_is_a_404(server):
    status, response = server.request(
        "POST", "/v1/responses", {"model": MODEL_NAME, "input": "Hi", "previous_response_id": "r"}
    )
    assert status == 404 and response["error"]["param"] == "previous_response_id"
    status, _ = server.request("GET", "/v1/responses/resp_x?stream=true")
    assert status == 400


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_the_engine_fails_alone_is_a_failed_response(client, stream):
    # The only token the grammar allows is a bad word: the engine fails this request alone.
    extra = {"structured_outputs": {"choice": ["a"]}, "bad_words": ["a"], "ignore_eos": False}
    if stream:
        events, response = streamed(client, extra, input="Hi")
        assert events[-1].type == "response.failed"
    else:
        response = respond(client, extra, input="Hi")
    assert response.status == "failed" and response.error.code == "server_error"
    assert response.error.message
    assert respond(client, input="Hi").status == "incomplete"  # the next one is served


def test_tokenize_counts_the_chat_prompt_with_its_tools(client, server):
    messages = [{"role": "user", "content": "Weather?"}]
    out = chat(client, messages, tools=CHAT_TOOLS, tool_choice="none", max_tokens=1)
    body = {"messages": messages, "tools": CHAT_TOOLS}
    status, counted = server.request("POST", "/tokenize", body)
    assert status == 200 and counted["count"] == out.usage.prompt_tokens
    status, plain = server.request("POST", "/tokenize", {"messages": messages})
    assert plain["count"] < counted["count"]  # the tools are in the prompt
    # A whole chat body (vllm-router's cache_aware policy sends one) counts the same.
    chat_body = {**body, "model": MODEL_NAME, "tool_choice": "none", "max_tokens": 1}
    assert server.request("POST", "/tokenize", chat_body)[1]["count"] == counted["count"]
    for bad, param in (
        ({"prompt": "Hi", "tools": CHAT_TOOLS}, "tools"),
        ({"prompt": "Hi", "messages": messages}, "prompt"),
        ({**body, "chat_template": "{{ 1 }}"}, "chat_template"),
    ):
        status, error = server.request("POST", "/tokenize", bad)
        assert status == 400 and error["error"]["param"] == param, error
