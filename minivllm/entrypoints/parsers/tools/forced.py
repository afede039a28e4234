"""Tool calls the request forced (tool_choice "required" or a named function): the output
was constrained to a JSON schema (constraints.py), so it parses, streamed or whole, into the
same calls; one cut short by max_tokens ends in a call with its arguments cut short."""

from __future__ import annotations

from minivllm.entrypoints.parsers.tools.base import (
    CallScanner,
    StreamDelta,
    ToolCall,
    arguments_delta,
    calls_of,
    header_delta,
    new_call_id,
)


def extract_required(text: str) -> list[ToolCall]:
    """The calls of a "required" output, `[{"name": ..., "parameters": {...}}, ...]`, read by
    RequiredToolStream, so that each call's arguments are exactly the text its stream sends.
    An output cut short by max_tokens keeps what its stream sent: the calls so far, the last
    one with its arguments' text up to the cut (the stream cannot take them back)."""
    stream = RequiredToolStream()
    delta = stream.feed(text)
    delta.add(stream.finish())
    return calls_of(delta)


class NamedToolStream:
    """A named function's stream: the output is its arguments, as they come."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.num_calls = 0

    def feed(self, text: str) -> StreamDelta:
        delta = StreamDelta()
        if self.num_calls == 0:
            self.num_calls = 1
            delta.tool_calls.append(header_delta(0, new_call_id(), self.name))
        if text:
            delta.tool_calls.append(arguments_delta(0, text))
        return delta

    def finish(self) -> StreamDelta:
        return self.feed("")


class RequiredToolStream:
    """A "required" stream: the array's calls one by one (name, then parameters' text)."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "open"  # open -> item -> call -> between -> item ... -> done
        self._call: CallScanner | None = None
        self.num_calls = 0

    def feed(self, text: str) -> StreamDelta:
        self._buffer += text
        delta = StreamDelta()
        while self._buffer:
            if self._state in ("open", "item", "between"):
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    break
                head = self._buffer[0]
                if self._state == "item" and head != "]":
                    self._state, self._call = "call", CallScanner(self.num_calls)
                    continue
                self._buffer = self._buffer[1:]
                expected = {"open": "[", "between": ","}.get(self._state)
                self._state = "done" if head == "]" else "item"
                if expected is not None and head not in (expected, "]"):
                    self._state = "done"  # not the schema's shape: nothing more to parse
            elif self._state == "call":
                assert self._call is not None
                piece, self._buffer = self._buffer, ""
                call_delta, self._buffer = self._call.feed(piece)
                delta.add(call_delta)
                if not self._call.done:
                    break
                self.num_calls += 1
                self._state = "between"
            else:  # done: the constraint allows nothing after the array
                self._buffer = ""
        return delta

    def finish(self) -> StreamDelta:
        if self._state == "call" and self._call is not None and self._call.name is not None:
            self.num_calls += 1  # cut short: what it sent is the call
        return StreamDelta()
