"""What a Responses API answer is made of: output items (reasoning, a message, function calls)
from the chat parser's message or, streamed, from its deltas as OpenAI's events; and the
response object around them.

A streamed answer's items are built from the same deltas as its events, so that the final
`response.completed` event holds what the deltas spelt out.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from minivllm.entrypoints.responses.protocol import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(
    req: ResponsesRequest,
    response_id: str,
    model: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    stored: bool = False,
) -> dict[str, Any]:
    """The response object (OpenAI's fields, the request's settings echoed)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    reasoning = req.reasoning.model_dump(exclude_none=True) if req.reasoning else None
    fmt = {"type": "text"}
    if req.text is not None and req.text.format is not None:
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True)
    tool_choice = req.tool_choice
    if tool_choice is None:
        tool_choice = "auto" if req.tools else "none"
    elif not isinstance(tool_choice, str):
        tool_choice = tool_choice.model_dump(exclude_none=True)
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "model": model,
        "instructions": req.instructions,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": reasoning,
        "store": stored,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "text": {"format": fmt},
        "tool_choice": tool_choice,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "top_logprobs": req.top_logprobs,
        "truncation": "disabled",
        "metadata": req.metadata,
        "user": req.user,
        "background": False,
        "usage": usage,
    }


def response_usage(
    num_prompt: int, num_cached: int, num_output: int, num_reasoning: int
) -> dict[str, Any]:
    return {
        "input_tokens": num_prompt,
        "input_tokens_details": {"cached_tokens": num_cached},
        "output_tokens": num_output,
        "output_tokens_details": {"reasoning_tokens": num_reasoning},
        "total_tokens": num_prompt + num_output,
    }


def _reasoning_item(text: str, status: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": new_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def _message_item(text: str, status: str, logprobs: list | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {
        "type": "message",
        "id": new_id("msg"),
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(
    message: dict[str, Any], status: str, logprobs: list | None
) -> list[dict[str, Any]]:
    """A whole answer's items from the chat parser's assistant message (chat/output.py
    full_message): its reasoning, its text (a message, also when empty and nothing else came),
    its tool calls; each "completed" but the last, "incomplete" where the answer did not
    complete. logprobs: the output_text's, or None when not asked for."""
    items = []
    if message.get("reasoning"):
        items.append(_reasoning_item(message["reasoning"], "completed"))
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if content or (content is not None and not calls and not items):
        items.append(_message_item(content, "completed", logprobs))
    for call in calls:
        function = call["function"]
        items.append(_call_item(call["id"], function["name"], function["arguments"], "completed"))
    if items:
        items[-1]["status"] = _item_status(status)
    return items


def _item_status(status: str) -> str:
    """The last item's status for the answer's ("failed", "cancelled": "incomplete")."""
    return "completed" if status == "completed" else "incomplete"


class OutputEvents:
    """One streamed answer as OpenAI's events: feed() takes the chat parser's delta fields
    ({"reasoning", "content", "tool_calls"}) and returns the events they make (an item is
    added when its first text comes and done when another starts or the answer ends);
    finish() ends the open item. `items` is the answer's output so far."""

    def __init__(self, with_logprobs: bool) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # a call's delta index -> its item
        # Logprobs of tokens that made no text yet: they go with the next text delta.
        self._pending: list | None = [] if with_logprobs else None

    def feed(self, fields: dict[str, Any], logprobs: list | None = None) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._pending is not None and logprobs:
            self._pending += logprobs
        if fields.get("reasoning"):
            item = self._ensure(events, "reasoning")
            item["content"][0]["text"] += fields["reasoning"]
            events.append(
                self._at(item, "response.reasoning_text.delta", delta=fields["reasoning"])
            )
        if fields.get("content"):
            item = self._ensure(events, "message")
            part = item["content"][0]
            part["text"] += fields["content"]
            delta = self._at(item, "response.output_text.delta", delta=fields["content"])
            delta["logprobs"] = self._take_logprobs(part)
            events.append(delta)
        for call in fields.get("tool_calls", []):
            function = call["function"]
            if "id" in call:  # a call's header: a new item
                item = _call_item(call["id"], function["name"], "", "in_progress")
                self._start(events, item)
                self._calls[call["index"]] = item
            item = self._calls[call["index"]]
            if function.get("arguments"):
                item["arguments"] += function["arguments"]
                events.append(
                    self._at(item, "response.function_call_arguments.delta",
                             delta=function["arguments"], content_index=None)
                )  # fmt: skip
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Ends the answer (its status): the open item is done, and an answer that had nothing
        at all gets its empty message, as whole answers do."""
        events: list[dict[str, Any]] = []
        if not self.items:
            self._ensure(events, "message")
        self._close(events, _item_status(status))
        return events

    def _take_logprobs(self, part: dict[str, Any]) -> list:
        if self._pending is None:
            return []
        taken, self._pending = self._pending, []
        part.setdefault("logprobs", []).extend(taken)
        return taken

    def _ensure(self, events: list, kind: str) -> dict[str, Any]:
        """The open item when it is of this kind, else a new one (the open one done first)."""
        if self._open is not None and self._open["type"] == kind:
            return self._open
        if kind == "reasoning":
            item = _reasoning_item("", "in_progress")
        else:
            item = _message_item("", "in_progress", [] if self._pending is not None else None)
        self._start(events, item)
        events.append(self._at(item, "response.content_part.added", part=_copy(item["content"][0])))
        return item

    def _start(self, events: list, item: dict[str, Any]) -> None:
        self._close(events)
        self.items.append(item)
        self._open = item
        events.append(self._event("response.output_item.added", item, item=_copy(item)))

    def _close(self, events: list, status: str = "completed") -> None:
        """Ends the open item: the last of the answer takes its status, the others complete."""
        item, self._open = self._open, None
        if item is None:
            return
        item["status"] = status
        if item["type"] == "function_call":
            events.append(
                self._at(item, "response.function_call_arguments.done",
                         arguments=item["arguments"], content_index=None)
            )  # fmt: skip
        else:
            part = item["content"][0]
            if item["type"] == "reasoning":
                events.append(self._at(item, "response.reasoning_text.done", text=part["text"]))
            else:
                if self._pending:  # tokens after the last text (a call's, the end's)
                    self._take_logprobs(part)
                done = self._at(item, "response.output_text.done", text=part["text"])
                done["logprobs"] = part.get("logprobs", [])
                events.append(done)
            events.append(self._at(item, "response.content_part.done", part=_copy(part)))
        events.append(self._event("response.output_item.done", item, item=_copy(item)))

    def _event(self, kind: str, of: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """An event about the item `of`."""
        return {"type": kind, "output_index": self.items.index(of), **fields}

    def _at(self, item: dict[str, Any], kind: str, content_index: int | None = 0, **fields):
        """An event about the item's content (or, content_index None, the item itself)."""
        event = self._event(kind, item, item_id=item["id"])
        if content_index is not None:
            event["content_index"] = content_index
        event.update(fields)
        return event


def _copy(value: Any) -> Any:
    """A snapshot of an item or part as it is now (events are serialized later)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def answer_message(items: list[dict[str, Any]]) -> dict[str, Any]:
    """An answer's items as the assistant's chat message (a stored turn; the next request's
    history)."""
    message: dict[str, Any] = {"role": "assistant"}
    for item in items:
        if item["type"] == "reasoning":
            message["reasoning"] = item["content"][0]["text"]
        elif item["type"] == "message":
            message["content"] = item["content"][0]["text"]
        else:
            call = {"name": item["name"], "arguments": item["arguments"]}
            message.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": call}
            )
    return message
