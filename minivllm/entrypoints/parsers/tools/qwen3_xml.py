"""The XML tool-call format of Qwen3-Coder and the Qwen3.5 / 3.6 family (vLLM's `qwen3_coder`,
also `qwen3_xml`):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Values are text; the tool's JSON schema says what each becomes in the call's JSON arguments
(`"days": 3`, not `"3"`): integer, number, boolean, null, object and array values are parsed
as such where they can be, anything else stays a string, as does a parameter the schema does
not name. One newline on each side of a value is the template's layout, not the value.

One scanner serves the whole output and its stream (so both give the same calls, to the
character): content until the first `<tool_call>` (or a bare `<function=`), then each call's
header once its name is complete and its arguments as they come: a string value's characters
as they arrive (JSON-escaped), any other value once it ends. Text after the calls is dropped,
as the other parsers drop it. A `<tool_call>` block with no function in it is content.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from minivllm.entrypoints.parsers.tools.base import (
    StreamDelta,
    ToolCall,
    arguments_delta,
    calls_of,
    first_marker,
    header_delta,
    held_back,
    new_call_id,
)
from minivllm.entrypoints.parsers.tools.schema_values import coerce, is_string_schema

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
# Where a value ends: its closing tag, or (a model that leaves it open) the next parameter,
# the function's end or the call's.
_VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END, END)

# A request's tools: name -> its parameters' JSON schema (an object schema's "properties").
ToolSchemas = dict[str, dict[str, Any]]
# Where the scanner is: text before any call, after <tool_call> before its function, in a
# function's name, between its parameters, in a parameter's name, in its value, after the
# function's end.
State = Literal["content", "preamble", "name", "args", "param", "value", "between"]


def extract_tool_calls(text: str, schemas: ToolSchemas) -> tuple[list[ToolCall], str | None]:
    """(calls, content) of a whole output: the stream's parse of all of it. Content is the text
    before the first call, None if blank."""
    stream = Qwen3XmlToolStream(schemas)
    delta = stream.feed(text)
    delta.add(stream.finish())
    calls = calls_of(delta)
    return calls, delta.content if delta.content.strip() or not calls else None


class Qwen3XmlToolStream:
    """The parse on a choice's text as it streams (feed pieces, then finish)."""

    def __init__(self, schemas: ToolSchemas) -> None:
        self.schemas = schemas
        self.num_calls = 0
        self._state: State = "content"
        self._buffer = ""
        # The opening of a call not yet known to be one (content if it is not): the
        # <tool_call> tag or nothing (a bare <function=), and the text after it.
        self._opening = ""
        self._raw = ""
        self._name = ""  # the call's function
        self._params = 0  # parameters written into the call's arguments
        self._param = ""  # the parameter being read
        self._streamed = False  # its value streams as a string
        self._value_started = False  # its first character is in (a leading newline dropped)
        self._value = ""  # a typed value's text, whole when it ends

    def feed(self, text: str) -> StreamDelta:
        self._buffer += text
        delta = StreamDelta()
        while self._step(delta, final=False):
            pass
        return delta

    def finish(self) -> StreamDelta:
        """The rest, at the end of the output: held-back text, an unterminated call closed."""
        delta = StreamDelta()
        while self._step(delta, final=True):
            pass
        state, rest = self._state, self._buffer
        self._buffer = ""
        if state == "content":
            self._content(delta, rest)
        elif state == "preamble":
            self._content(delta, self._opening + self._raw + rest)
        elif state == "name":  # `<function=` without its `>`: no call
            self._content(delta, self._opening + self._raw + FUNCTION + rest)
        elif state in ("args", "param"):
            self._close_function(delta)
        elif state == "value":
            self._end_value(delta, rest)
            self._close_function(delta)
        self._state = "between"
        return delta

    def _step(self, delta: StreamDelta, final: bool) -> bool:
        """Consumes what the buffer decides; True while there may be more to decide."""
        return _HANDLERS[self._state](self, delta, final)

    def _take(
        self, markers: tuple[str, ...], final: bool, hold_newline: bool = False
    ) -> tuple[str, str | None]:
        """(the text before the first of markers in the buffer, that marker), both consumed; or,
        none there yet, (the text no marker can start in, None), the rest held back (and a
        last newline with hold_newline: a value's layout, if the value ends there)."""
        buffer = self._buffer
        found = first_marker(buffer, markers)
        if found is None:
            keep = 0 if final else held_back(buffer, markers)  # none held at the end
            if hold_newline and buffer[: len(buffer) - keep].endswith("\n"):
                keep += 1
            self._buffer = buffer[len(buffer) - keep :]
            return buffer[: len(buffer) - keep], None
        index, marker = found
        self._buffer = buffer[index + len(marker) :]
        return buffer[:index], marker

    def _on_content(self, delta: StreamDelta, final: bool) -> bool:
        text, marker = self._take((START, FUNCTION), final)
        self._content(delta, text)
        if marker is None:
            return False
        self._open(marker)
        return True

    def _open(self, marker: str) -> None:
        """A call may start: a <tool_call> block (its function next) or a bare <function=."""
        self._opening, self._raw = (START if marker == START else ""), ""
        self._state = "preamble" if marker == START else "name"

    def _on_preamble(self, delta: StreamDelta, final: bool) -> bool:
        text, marker = self._take((FUNCTION, END), final)
        self._raw += text
        if marker is None:
            return False
        if marker == END:  # a block with no function: its text is content
            self._content(delta, self._opening + self._raw + END)
            self._state = "content"
        else:
            self._state = "name"
        return True

    def _on_name(self, delta: StreamDelta, final: bool) -> bool:
        buffer = self._buffer
        index = buffer.find(">")
        name = buffer[: len(buffer) if index == -1 else index]
        if "<" in name or "\n" in name or (index != -1 and not name.strip()):
            # No function name (another tag, a line break, nothing): not a call after all;
            # the text goes on as content.
            self._content(delta, self._opening + self._raw + FUNCTION)
            self._state = "content"
            return True
        if index == -1:
            return False
        self._name = name.strip()
        self._buffer = buffer[index + 1 :]
        self._params = 0
        delta.tool_calls.append(header_delta(self.num_calls, new_call_id(), self._name))
        self.num_calls += 1
        self._state = "args"
        return True

    def _on_args(self, delta: StreamDelta, final: bool) -> bool:
        _, marker = self._take((PARAMETER, FUNCTION_END, END), final)  # between: layout
        if marker is None:
            return False
        if marker == PARAMETER:
            self._state = "param"
        else:
            self._end_function(delta, marker)
        return True

    def _on_param(self, delta: StreamDelta, final: bool) -> bool:
        index = self._buffer.find(">")
        if index == -1:
            return False
        self._param = self._buffer[:index].strip()
        self._buffer = self._buffer[index + 1 :]
        self._streamed = is_string_schema(self._property(self._param))
        self._value_started = False
        self._value = ""
        if self._streamed:
            self._arguments(delta, self._key() + '"')
        self._state = "value"
        return True

    def _on_value(self, delta: StreamDelta, final: bool) -> bool:
        if final and first_marker(self._buffer, _VALUE_ENDS) is None:
            return False  # an unterminated value: finish() ends it
        text, marker = self._take(_VALUE_ENDS, final, hold_newline=True)
        if marker is None:
            self._value_text(delta, text)
            return False
        self._end_value(delta, text)
        if marker == PARAMETER_END:
            self._state = "args"
        elif marker == PARAMETER:
            self._state = "param"
        else:
            self._end_function(delta, marker)
        return True

    def _on_between(self, delta: StreamDelta, final: bool) -> bool:
        """After </function>: </tool_call>, or another function (bare or in a block)."""
        _, marker = self._take((END, START, FUNCTION), final)
        if marker is None:
            return False
        if marker == END:
            self._state = "content"
        else:
            self._open(marker)
        return True

    def _end_function(self, delta: StreamDelta, marker: str) -> None:
        """</function> (more may follow in the block) or </tool_call> (the block ends)."""
        self._close_function(delta)
        self._state = "between" if marker == FUNCTION_END else "content"

    def _value_text(self, delta: StreamDelta, text: str) -> None:
        """A piece of the value (not its end): dropped leading newline, then written (a string)
        or kept (a typed value, whole at its end)."""
        if text and not self._value_started:
            self._value_started = True
            text = text[1:] if text.startswith("\n") else text
        if not text:
            return
        if self._streamed:
            self._arguments(delta, json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self._value += text

    def _end_value(self, delta: StreamDelta, text: str) -> None:
        self._value_text(delta, text[:-1] if text.endswith("\n") else text)
        if self._streamed:
            self._arguments(delta, '"')
        else:
            value = coerce(self._value, self._property(self._param))
            self._arguments(delta, self._key() + json.dumps(value, ensure_ascii=False))
        self._params += 1

    def _close_function(self, delta: StreamDelta) -> None:
        self._arguments(delta, "}" if self._params else "{}")

    def _key(self) -> str:
        """The parameter's key in the arguments' JSON, after "{" or a comma."""
        key = json.dumps(self._param, ensure_ascii=False)
        return ("{" if self._params == 0 else ", ") + key + ": "

    def _property(self, name: str) -> dict[str, Any] | None:
        properties = self.schemas.get(self._name, {}).get("properties")
        return properties.get(name) if isinstance(properties, dict) else None

    def _arguments(self, delta: StreamDelta, text: str) -> None:
        delta.add(StreamDelta(tool_calls=[arguments_delta(self.num_calls - 1, text)]))

    def _content(self, delta: StreamDelta, text: str) -> None:
        if self.num_calls == 0:  # after a call, text is dropped
            delta.content += text


# Each state's step: (stream, delta, final) -> whether it may decide more.
_HANDLERS: dict[State, Callable[[Qwen3XmlToolStream, StreamDelta, bool], bool]] = {
    "content": Qwen3XmlToolStream._on_content,
    "preamble": Qwen3XmlToolStream._on_preamble,
    "name": Qwen3XmlToolStream._on_name,
    "args": Qwen3XmlToolStream._on_args,
    "param": Qwen3XmlToolStream._on_param,
    "value": Qwen3XmlToolStream._on_value,
    "between": Qwen3XmlToolStream._on_between,
}
