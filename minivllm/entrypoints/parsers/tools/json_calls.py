"""Tool calls written as bare JSON, `{"name": ..., "arguments" (or "parameters"): {...}}`,
several separated by `;`, optionally after a marker (Llama 3.x's `<|python_tag|>`), whole or
streamed. An output is calls only if it starts (after whitespace and the marker) with a
call's header, the name first; the text after the last call is dropped."""

from __future__ import annotations

import json

from minivllm.entrypoints.parsers.tools.base import (
    CallScanner,
    StreamDelta,
    ToolCall,
    parse_call,
)

SEPARATOR = ";"
_KEYS = ('"arguments"', '"parameters"')


def _literal(text: str, pos: int, options: tuple[str, ...]) -> tuple[int, bool | None]:
    """(position after the one option text[pos:] starts with, True), or (pos, None) if text
    ends inside an option, or (pos, False) if it starts with none."""
    for option in options:
        if text.startswith(option, pos):
            return pos + len(option), True
    rest = text[pos:]
    return pos, None if any(option.startswith(rest) for option in options) else False


def _string_end(text: str, pos: int) -> int | None:
    """Position after the JSON string opening at text[pos - 1], or None if it does not end."""
    escape = False
    for i in range(pos, len(text)):
        if escape:
            escape = False
        elif text[i] == "\\":
            escape = True
        elif text[i] == '"':
            return i + 1
    return None


def header_verdict(text: str) -> bool | None:
    """True if text starts with a call's header, `{"name": "...", "arguments":` (or
    "parameters", any JSON whitespace between), False if it cannot, None while it may."""
    steps: tuple = (("{",), ('"name"',), (":",), ('"',), None, (",",), _KEYS, (":",))
    pos = 0
    for options in steps:
        if options is None:  # the name's characters, up to its closing quote
            end = _string_end(text, pos)
            if end is None:
                return None
            pos = end
            continue
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        pos, verdict = _literal(text, pos, options)
        if verdict is not True:
            return verdict
    return True


def _strip_marker(text: str, marker: str | None) -> str | None:
    """text after its leading whitespace and the marker (if any, and then whitespace), or
    None while text may still be the start of the marker."""
    head = text.lstrip()
    if marker:
        if head.startswith(marker):
            return head[len(marker) :].lstrip()
        if marker.startswith(head):
            return None
    return head


def extract_json_calls(text: str, marker: str | None = None) -> tuple[list[ToolCall], str | None]:
    """(calls, content) of a whole output: the calls and None, or no calls and all the text
    (also when the first call does not parse: it was cut short)."""
    body = _strip_marker(text, marker) or ""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pos = 0
    while header_verdict(body[pos:]) is True:
        try:
            _, end = decoder.raw_decode(body, pos)
        except ValueError:
            break
        call = parse_call(body[pos:end])
        if call is None:
            break
        calls.append(call)
        rest = body[end:].lstrip()
        if not rest.startswith(SEPARATOR):
            break
        rest = rest[len(SEPARATOR) :].lstrip()
        pos = len(body) - len(rest)
    return (calls, None) if calls else ([], text)


class JsonCallsStream:
    """extract_json_calls on text as it streams: nothing while the start is undecided (blank,
    the marker's first characters, a header's first characters), then content as it comes,
    or each call's header and argument text as they come."""

    def __init__(self, marker: str | None = None) -> None:
        self.marker = marker
        self.num_calls = 0
        self._buffer = ""
        self._state = "start"  # start -> content | call -> between -> call ... | done
        self._call: CallScanner | None = None

    def feed(self, text: str) -> StreamDelta:
        self._buffer += text
        delta = StreamDelta()
        while self._buffer:
            if self._state == "start":
                head = _strip_marker(self._buffer, self.marker)
                verdict = header_verdict(head) if head else None
                if verdict is None:
                    break
                self._state = "call" if verdict else "content"
                if verdict:
                    self._buffer = head
            elif self._state == "content":
                delta.content += self._buffer
                self._buffer = ""
            elif self._state == "call":
                if self._call is None:
                    self._call = CallScanner(self.num_calls)
                piece, self._buffer = self._buffer, ""
                call_delta, self._buffer = self._call.feed(piece)
                delta.add(call_delta)
                if not self._call.done:
                    break
                self.num_calls += 1
                self._state, self._call = "between", None
            elif self._state == "between":
                if not self._next_call():
                    break
            else:  # done: what follows the calls is dropped
                self._buffer = ""
        return delta

    def _next_call(self) -> bool:
        """After a call: the separator and the next call's header (True once decided)."""
        head = self._buffer.lstrip()
        if not head:
            return False
        if not head.startswith(SEPARATOR):
            self._state = "done"
            return True
        head = head[len(SEPARATOR) :].lstrip()
        verdict = header_verdict(head) if head else None
        if verdict is None:
            return False
        self._state = "call" if verdict else "done"
        self._buffer = head
        return True

    def finish(self) -> StreamDelta:
        """The rest, at the end of the output: an undecided start is content; a call cut
        short counts as sent."""
        delta = StreamDelta()
        if self._state == "start":
            delta.content, self._buffer = self._buffer, ""
        elif self._state == "call" and self._call is not None and self._call.name is not None:
            self.num_calls += 1
        return delta
