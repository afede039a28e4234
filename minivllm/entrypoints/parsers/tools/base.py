"""What every tool-call parser returns: calls in OpenAI's shape, whole or as stream deltas,
and the scanner that streams one {"name": ..., "arguments": ...} object as its text arrives."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's form


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=new_call_id)

    def to_dict(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass
class StreamDelta:
    """What one piece of a choice's text adds: content, and tool-call deltas (OpenAI's: the
    first of a call has index, id, type, function.name; later ones function.arguments). A
    call's header stays a delta of its own, even when its arguments come in the same piece
    (several tokens a step: jump-forward, speculative decoding): the name first, alone (the
    server sends them in chunks of their own: chat/output.one_delta_per_call)."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: StreamDelta) -> None:
        self.content += other.content
        for delta in other.tool_calls:
            last = self.tool_calls[-1] if self.tool_calls else None
            if (
                last is not None
                and last["index"] == delta["index"]
                and "id" not in delta
                and "id" not in last
            ):
                last["function"]["arguments"] += delta["function"]["arguments"]
            else:
                self.tool_calls.append(delta)


def header_delta(index: int, call_id: str, name: str) -> dict[str, Any]:
    return {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": ""},
    }


def arguments_delta(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": text}}


def partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of token (held back: the
    next piece may complete the token)."""
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many of text's last characters may start one of markers (held back: the next piece
    may complete it)."""
    return max(partial_suffix(text, marker) for marker in markers)


def first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """(index, marker) of the marker that occurs first in text, or None."""
    found = [(i, marker) for marker in markers if (i := text.find(marker)) != -1]
    return min(found) if found else None


_CALL_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:'
)


class CallScanner:
    """One call object, {"name": "...", "arguments" (or "parameters"): VALUE}, fed as it
    arrives: the header delta once the name is complete, then VALUE's text as it comes
    (concatenated, exactly the model's JSON text of the value), done after the closing
    brace. Objects in another key order wait for close() and are parsed whole."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.call_id = new_call_id()
        self.name: str | None = None
        self.done = False
        self._head = ""  # text before the value starts
        self._value = _ValueEnd()

    def feed(self, text: str) -> tuple[StreamDelta, str]:
        """(the delta, text after the object's closing brace: not this call's)."""
        delta = StreamDelta()
        if self.name is None:
            self._head += text
            match = _CALL_HEAD.match(self._head)
            if match is None:
                return delta, ""
            self.name = json.loads(f'"{match.group(1)}"')
            delta.tool_calls.append(header_delta(self.index, self.call_id, self.name))
            text = self._head[match.end() :]
        if not self._value.done:
            start, end = self._value.feed(text)
            if end > start:
                delta.tool_calls.append(arguments_delta(self.index, text[start:end]))
            text = text[end:]
        if self._value.done and not self.done:
            close = text.find("}")
            if close == -1:
                return delta, ""
            self.done = True
            text = text[close + 1 :]
        return delta, text if self.done else ""

    def close(self) -> StreamDelta | None:
        """At the end of the call's text: a call that never showed its header is parsed
        whole (its delta), or None if it is no call (not a JSON object with a name)."""
        if self.name is not None:
            return StreamDelta()
        call = parse_call(self._head)
        if call is None:
            return None
        self.name = call.name
        return StreamDelta(
            tool_calls=[
                header_delta(self.index, self.call_id, call.name),
                arguments_delta(self.index, call.arguments),
            ]
        )

    @property
    def raw_text(self) -> str:
        return self._head


def parse_call(text: str) -> ToolCall | None:
    """A JSON object {"name": str, "arguments" (or "parameters"): value} as a ToolCall, else
    None. The arguments are the value's own text where the name comes first (exactly what
    CallScanner streams), else the value re-serialized; a missing value is {}."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    match = _CALL_HEAD.match(text)
    if match is not None:
        rest = text[match.end() :]
        start, end = _ValueEnd().feed(rest)
        return ToolCall(obj["name"], rest[start:end])
    value = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    return ToolCall(obj["name"], json.dumps(value, ensure_ascii=False))


def calls_of(delta: StreamDelta) -> list[ToolCall]:
    """The calls a stream's deltas add up to (each one's id, name and argument text)."""
    calls: dict[int, ToolCall] = {}
    for d in delta.tool_calls:
        if "id" in d:
            calls[d["index"]] = ToolCall(d["function"]["name"], "", d["id"])
        calls[d["index"]].arguments += d["function"]["arguments"]
    return [calls[index] for index in sorted(calls)]


class _ValueEnd:
    """Finds where one JSON value ends in text fed piece by piece (strings, escapes, nesting);
    leading whitespace is skipped."""

    def __init__(self) -> None:
        self.done = False
        self._started = False
        self._scalar = False
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> tuple[int, int]:
        """(start, end) of the value's characters in text; done once its last one is in."""
        start = 0
        for i, ch in enumerate(text):
            if not self._started:
                if ch.isspace():
                    start = i + 1
                    continue
                self._started = True
                if ch in "{[":
                    self._depth = 1
                elif ch == '"':
                    self._in_string = True
                else:
                    self._scalar = True
                continue
            if self._scalar:
                if ch in ",}] \t\r\n":
                    self.done = True
                    return start, i
            elif self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
                    if self._depth == 0:
                        self.done = True
                        return start, i + 1
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.done = True
                    return start, i + 1
        return start, len(text)
