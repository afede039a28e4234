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

import ast
import json
from typing import Any

from minivllm.entrypoints.parsers.tools.base import (
    StreamDelta,
    ToolCall,
    arguments_delta,
    calls_of,
    header_delta,
    new_call_id,
    partial_suffix,
)

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
# Where a value ends: its closing tag, or (a model that leaves it open) the next parameter,
# the function's end or the call's.
_VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END, END)

# A request's tools: name -> its parameters' JSON schema (an object schema's "properties").
ToolSchemas = dict[str, dict[str, Any]]


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
        self._state = "content"  # content, preamble, name, args, param, value, between
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
        state, buffer = self._state, self._buffer
        if state == "content":
            found = _first(buffer, (START, FUNCTION))
            if found is None:
                keep = _held(buffer, (START, FUNCTION), final)
                self._content(delta, buffer[: len(buffer) - keep])
                self._buffer = buffer[len(buffer) - keep :]
                return False
            index, marker = found
            self._content(delta, buffer[:index])
            self._buffer = buffer[index + len(marker) :]
            self._opening, self._raw = (START if marker == START else ""), ""
            self._state = "preamble" if marker == START else "name"
            return True
        if state == "preamble":
            found = _first(buffer, (FUNCTION, END))
            if found is None:
                keep = _held(buffer, (FUNCTION, END), final)
                self._raw += buffer[: len(buffer) - keep]
                self._buffer = buffer[len(buffer) - keep :]
                return False
            index, marker = found
            self._raw += buffer[:index]
            self._buffer = buffer[index + len(marker) :]
            if marker == END:  # a block with no function: its text is content
                self._content(delta, self._opening + self._raw + END)
                self._state = "content"
            else:
                self._state = "name"
            return True
        if state == "name":
            index = buffer.find(">")
            name = buffer[: len(buffer) if index == -1 else index]
            if "<" in name or "\n" in name or (index != -1 and not name.strip()):
                # No function name (another tag, a line break, nothing): not a call after
                # all; the text goes on as content.
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
        if state == "args":
            found = _first(buffer, (PARAMETER, FUNCTION_END, END))
            if found is None:
                keep = _held(buffer, (PARAMETER, FUNCTION_END, END), final)
                self._buffer = buffer[len(buffer) - keep :]  # text between parameters: layout
                return False
            index, marker = found
            self._buffer = buffer[index + len(marker) :]
            if marker == PARAMETER:
                self._state = "param"
            else:
                self._close_function(delta)
                self._state = "between" if marker == FUNCTION_END else "content"
            return True
        if state == "param":
            index = buffer.find(">")
            if index == -1:
                return False
            self._param = buffer[:index].strip()
            self._buffer = buffer[index + 1 :]
            self._streamed = _is_string(self._property(self._param))
            self._value_started = False
            self._value = ""
            if self._streamed:
                self._arguments(delta, self._key() + '"')
            self._state = "value"
            return True
        if state == "value":
            found = _first(buffer, _VALUE_ENDS)
            if found is None:
                if final:  # an unterminated value: finish() ends it
                    return False
                keep = _held(buffer, _VALUE_ENDS, final)
                if buffer[: len(buffer) - keep].endswith("\n"):
                    keep += 1  # the layout's newline, if the value ends here
                self._value_text(delta, buffer[: len(buffer) - keep])
                self._buffer = buffer[len(buffer) - keep :]
                return False
            index, marker = found
            self._end_value(delta, buffer[:index])
            self._buffer = buffer[index + len(marker) :]
            if marker == PARAMETER_END:
                self._state = "args"
            elif marker == PARAMETER:
                self._state = "param"
            else:
                self._close_function(delta)
                self._state = "between" if marker == FUNCTION_END else "content"
            return True
        if state == "between":  # after </function>: </tool_call>, or another function
            found = _first(buffer, (END, START, FUNCTION))
            if found is None:
                keep = _held(buffer, (END, START, FUNCTION), final)
                self._buffer = buffer[len(buffer) - keep :]
                return False
            index, marker = found
            self._buffer = buffer[index + len(marker) :]
            self._opening, self._raw = (START if marker == START else ""), ""
            self._state = {END: "content", START: "preamble", FUNCTION: "name"}[marker]
            return True
        raise AssertionError(state)

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


def _held(text: str, markers: tuple[str, ...], final: bool) -> int:
    """How many of text's last characters to hold back: a start of one of markers, which the
    next piece may complete (none at the end of the output)."""
    return 0 if final else max(partial_suffix(text, m) for m in markers)


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """(index, marker) of the marker that occurs first in text, or None."""
    found = [(text.find(m), m) for m in markers]
    found = [(i, m) for i, m in found if i != -1]
    return min(found) if found else None


def _types(schema: dict[str, Any] | None) -> list[str]:
    """The JSON types a property's schema allows ("type", or its anyOf / oneOf members')."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    members = schema.get("anyOf") or schema.get("oneOf") or []
    return [t for m in members if isinstance(m, dict) for t in _types(m)]


def _is_string(schema: dict[str, Any] | None) -> bool:
    """A value streamed as a string: the schema allows strings only, or says nothing."""
    types = set(_types(schema))
    return not types or types == {"string"}


def coerce(value: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's text as the JSON value its schema asks for, else the text itself."""
    types = set(_types(schema))
    if not types or types == {"string"}:
        return value
    text = value.strip()
    if "null" in types and text == "null":
        return None
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if types & {"integer", "number"}:
        number = _json(text)
        if isinstance(number, int) and not isinstance(number, bool):
            return number
        if isinstance(number, float) and "number" in types:
            return number
    if types & {"object", "array"}:
        parsed = _container(text)
        if isinstance(parsed, dict) and "object" in types:
            return parsed
        if isinstance(parsed, list) and "array" in types:
            return parsed
    return value


def _json(text: str) -> Any:
    """The JSON value of text, or None (also for NaN and the infinities, which Python's json
    reads but JSON has not)."""
    try:
        return _strict(json.loads(text))
    except (ValueError, RecursionError):
        return None


def _strict(value: Any) -> Any:
    """value if JSON can hold it (no NaN or infinities, no sets, bytes or tuple keys), else
    None."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return None


def _container(text: str) -> Any:
    """JSON text, or a Python literal (single quotes, True / None: what models also write)."""
    parsed = _json(text)
    if parsed is not None:
        return parsed
    try:
        return _strict(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
