"""What an Anthropic Messages answer is made of: content blocks (thinking, text, tool_use)
from the chat parser's message or, streamed, from its deltas as Anthropic's events; the stop
reason; errors in Anthropic's shape."""

from __future__ import annotations

import json
from typing import Any

from minivllm.outputs import CompletionOutput

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    503: "overloaded_error",
}


def error_body(message: str, status: int) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def stop_reason(choice: CompletionOutput, called: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished choice."""
    if choice.finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(choice.stop_reason, str):  # one of stop_sequences matched
        return "stop_sequence", choice.stop_reason
    return "end_turn", None


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the input object (a call cut short by max_tokens: {})."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole answer's blocks from the chat parser's assistant message (chat/output.py
    full_message): its reasoning, its text, its calls; no empty text block."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning"):
        blocks.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"],
             "input": _arguments(function["arguments"])}
        )  # fmt: skip
    return blocks


class BlockEvents:
    """One streamed answer as Anthropic's content-block events: feed() takes the chat parser's
    delta fields ({"reasoning", "content", "tool_calls"}) and returns the events they make (a
    block starts with its first text and stops when another starts or the answer ends)."""

    def __init__(self) -> None:
        self.num_blocks = 0
        self.called = False
        self._open: str | None = None  # the open block's type
        self._calls: dict[int, int] = {}  # a call's delta index -> its block's index

    def feed(self, fields: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if fields.get("reasoning"):
            self._ensure(events, {"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": fields["reasoning"]}))
        if fields.get("content"):
            self._ensure(events, {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": fields["content"]}))
        for call in fields.get("tool_calls", []):
            function = call["function"]
            if "id" in call:
                block = {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": function["name"],
                    "input": {},
                }
                self._start(events, block)
                self._calls[call["index"]] = self.num_blocks - 1
                self.called = True
            if function.get("arguments"):
                delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
                events.append(self._delta(delta, self._calls[call["index"]]))
        return events

    def finish(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        self._stop(events)
        return events

    def _ensure(self, events: list, block: dict[str, Any]) -> None:
        if self._open != block["type"]:
            self._start(events, block)

    def _start(self, events: list, block: dict[str, Any]) -> None:
        self._stop(events)
        events.append(
            {"type": "content_block_start", "index": self.num_blocks, "content_block": block}
        )
        self.num_blocks += 1
        self._open = block["type"]

    def _stop(self, events: list) -> None:
        if self._open is not None:
            events.append({"type": "content_block_stop", "index": self.num_blocks - 1})
            self._open = None

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> dict[str, Any]:
        at = self.num_blocks - 1 if index is None else index
        return {"type": "content_block_delta", "index": at, "delta": delta}
