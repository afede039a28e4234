"""The Hermes tool-call format (what Qwen2.5 and Qwen3 emit): calls as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, content before the first one."""

from __future__ import annotations

import re

from minivllm.entrypoints.openai.tool_parsers.base import (
    CallScanner,
    StreamDelta,
    ToolCall,
    parse_call,
    partial_suffix,
)

START, END = "<tool_call>", "</tool_call>"
_CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)$", re.DOTALL)


def extract_tool_calls(text: str) -> tuple[list[ToolCall], str | None]:
    """(calls, content) of a whole output. Content is the text before the first call (None if
    blank; text after the calls is dropped, as vLLM does); one call that does not parse
    means no calls, and all the text is content."""
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
    argument text as they come. A call that is no JSON call goes out as content."""

    def __init__(self) -> None:
        self._buffer = ""
        self._call: CallScanner | None = None
        self.num_calls = 0

    def feed(self, text: str) -> StreamDelta:
        self._buffer += text
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
        self.num_calls += 1

    def _content(self, delta: StreamDelta, text: str) -> None:
        if self.num_calls == 0:  # after a call, text is dropped (as in extract_tool_calls)
            delta.content += text
