"""What a tool parameter's text becomes under the tool's JSON schema: a value of a type the schema
allows that the text parses as (null, boolean, integer, number, object, array: tried in that
order), else the text. For formats whose values are text (qwen3_xml's XML calls)."""

from __future__ import annotations

import ast
import json
from typing import Any


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


def is_string_schema(schema: dict[str, Any] | None) -> bool:
    """A value streamed as a string: the schema allows strings only, or says nothing."""
    types = set(_types(schema))
    return not types or types == {"string"}


def coerce(value: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's text as the JSON value its schema asks for, else the text itself (no
    schema, or one that allows strings only: the text)."""
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
