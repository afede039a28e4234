"""The Hermes tool-call format (what Qwen2.5 and Qwen3 emit): calls as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, content before the first one; an
output that starts with a bare JSON call (no tags) is read as json_calls reads it."""

from __future__ import annotations

import re

from minivllm.entrypoints.parsers.tools.base import (
    CallScanner,
    StreamDelta,
    ToolCall,
    parse_call,
    partial_suffix,
)
from minivllm.entrypoints.parsers.tools.json_calls import (
    JsonCallsStream,
    extract_json_calls,
    header_verdict,
)

START, END = "<tool_call>", "</tool_call>"
_CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)$", re.DOTALL)


def extract_tool_calls(text: str, schemas: object = None) -> tuple[list[ToolCall], str | None]:
    """(calls, content) of a whole output. Content is the text before the first call (None if
    blank; text after the calls is dropped, as vLLM does); one call that does not parse
    means no calls, and all the text is content. schemas: unused (JSON calls carry their
    types)."""
    if header_verdict(text.lstrip()) is True:
        return extract_json_calls(text)
    if START not in text:
        return [], text
    calls = []
    for match in _CALLS.finditer(text):
        call = parse_call((match.group(1) or match.group(2) or "").strip())
        if call is None:
            return [], text
        calls.append(call)
    content = text[: text.find(START)]
    return calls, content if content.strip() else None


class HermesToolStream:
    """The same parse, on a choice's text as it streams: content until the first
    `<tool_call>` (a piece that may be its start is held back), then each call's header and
    argument text as they come. A call that is no JSON call goes out as content. An output
    that starts with a bare JSON call's header goes to a JsonCallsStream instead (until the
    start is decided, nothing is sent)."""

    def __init__(self, schemas: object = None) -> None:  # schemas: as extract_tool_calls
        self._buffer = ""
        self._call: CallScanner | None = None
        self._num_calls = 0
        # Until the start is decided: a stream of bare JSON calls, or None for tags.
        self._started = False
        self._bare: JsonCallsStream | None = None

    @property
    def num_calls(self) -> int:
        return self._bare.num_calls if self._bare is not None else self._num_calls

    def feed(self, text: str) -> StreamDelta:
        if self._bare is not None:
            return self._bare.feed(text)
        self._buffer += text
        if not self._started:
            verdict = header_verdict(self._buffer.lstrip()) if self._buffer.strip() else None
            if verdict is None:
                return StreamDelta()
            self._started = True
            if verdict:
                self._bare, text, self._buffer = JsonCallsStream(), self._buffer, ""
                return self._bare.feed(text)
        delta = StreamDelta()
        while True:
            if self._call is None:
                index = self._buffer.find(START)
                if index == -1:
                    keep = partial_suffix(self._buffer, START)
                    self._content(delta, self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return delta
                self._content(delta, self._buffer[:index])
                self._buffer = self._buffer[index + len(START) :]
                self._call = CallScanner(self.num_calls)
                continue
            index = self._buffer.find(END)
            if index == -1:
                keep = partial_suffix(self._buffer, END)
                piece = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(piece) :]
                delta.add(self._call.feed(piece)[0])
                return delta
            piece, self._buffer = self._buffer[:index], self._buffer[index + len(END) :]
            delta.add(self._call.feed(piece)[0])
            self._close(delta)

    def finish(self) -> StreamDelta:
        """The rest, at the end of the output (an unterminated call is closed here)."""
        if self._bare is not None:
            return self._bare.finish()
        delta = StreamDelta()
        if self._call is not None:
            delta.add(self._call.feed(self._buffer)[0])
            self._close(delta)
        else:
            self._content(delta, self._buffer)
        self._buffer = ""
        return delta

    def _close(self, delta: StreamDelta) -> None:
        call, self._call = self._call, None
        assert call is not None
        closed = call.close()
        if closed is None:
            self._content(delta, START + call.raw_text + END)
            return
        delta.add(closed)
        self._num_calls += 1

    def _content(self, delta: StreamDelta, text: str) -> None:
        if self._num_calls == 0:  # after a call, text is dropped (as in extract_tool_calls)
            delta.content += text
