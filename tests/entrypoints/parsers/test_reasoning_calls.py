"""A tool call the model writes inside its think block (vLLM #39056): with tool_choice
"auto", the parser's call marker ends the reasoning, so the call reaches the tool parser;
whole and streamed at every split, the same split."""

from __future__ import annotations

import pytest

from minivllm.entrypoints.openai.chat.output import ChatOutputSpec, ChoiceParser, full_message
from minivllm.entrypoints.parsers.reasoning import ThinkReasoningStream

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
LLAMA_CALL = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}'


def splits(text: str):
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    yield list(text)


@pytest.mark.parametrize(
    "text, marker",
    [
        (f"<think>I should look it up. {CALL}", "<tool_call>"),  # never closed
        (f"<think>I should look it up. {CALL}\n</think>\n", "<tool_call>"),  # closed after it
        (f"<think>I should look it up. {LLAMA_CALL}", "<|python_tag|>"),
    ],
)
def test_the_call_marker_ends_the_reasoning(text, marker):
    parser = "hermes" if marker == "<tool_call>" else "llama3_json"
    spec = ChatOutputSpec("auto", parser, reasoning_parser="qwen3", reasoning_call_marker=marker)
    message, finish = full_message(spec, text, "stop")
    assert message["reasoning"] == "I should look it up. "
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert finish == "tool_calls" and message["content"] is None
    for parts in splits(text):
        choice = ChoiceParser(spec)
        fields = [choice.feed(p) for p in parts[:-1]] + [choice.feed(parts[-1], final=True)]
        assert "".join(f.get("reasoning", "") for f in fields) == message["reasoning"]
        assert not "".join(f.get("content", "") for f in fields)
        names = [
            d["function"]["name"] for f in fields for d in f.get("tool_calls", []) if "id" in d
        ]
        assert names == ["get_weather"] and choice.finish_reason("stop") == "tool_calls"


def test_without_a_marker_the_block_is_reasoning():
    text = f"<think>a {CALL}</think>b"
    for marker in (None, "<tool_call>"):
        stream = ThinkReasoningStream(call_marker=marker)
        parts = [stream.feed(text), stream.finish()]
        reasoning = "".join(r for r, _ in parts)
        content = "".join(c for _, c in parts)
        if marker is None:
            assert (reasoning, content) == (f"a {CALL}", "b")
        else:
            assert (reasoning, content) == ("a ", f"{CALL}</think>b")
