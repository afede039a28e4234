"""The Llama 3.x JSON tool-call format: `{"name": ..., "parameters": {...}}` (or
"arguments"), optionally after `<|python_tag|>`, several separated by `;` (vLLM's
llama3_json parser)."""

from __future__ import annotations

from minivllm.entrypoints.parsers.tools.base import ToolCall
from minivllm.entrypoints.parsers.tools.json_calls import JsonCallsStream, extract_json_calls

PYTHON_TAG = "<|python_tag|>"


def extract_tool_calls(text: str, schemas: object = None) -> tuple[list[ToolCall], str | None]:
    """(calls, content) of a whole output (json_calls.extract_json_calls; schemas: unused, JSON
    calls carry their types)."""
    return extract_json_calls(text, PYTHON_TAG)


class Llama3JsonToolStream(JsonCallsStream):
    """The same parse, on a choice's text as it streams."""

    def __init__(self, schemas: object = None) -> None:  # schemas: as extract_tool_calls
        super().__init__(PYTHON_TAG)
