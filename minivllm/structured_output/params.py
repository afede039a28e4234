"""StructuredOutputsParams: what a request asks its output to match (vLLM's names), validated
on construction, and its canonical spec key, the unit of compilation and caching."""

from __future__ import annotations

from dataclasses import dataclass, field
from json import JSONDecodeError, dumps, loads
from typing import Any, Literal, NamedTuple

from minivllm.structured_output.schema_limits import check_schema_limits

StructuredOutputKind = Literal["json", "regex", "choice", "grammar", "json_object"]
_KINDS: tuple[StructuredOutputKind, ...] = ("json", "regex", "choice", "grammar", "json_object")


class StructuredOutputSpec(NamedTuple):
    """The canonical, hashable form of a constraint: equal specs compile to the same grammar.

    text: a JSON schema as compact JSON, keys in their given order, which is the order of
    the properties in the output (json), the regex or grammar text
    as given (regex, grammar), the choices as a JSON list (choice), "" (json_object)."""

    kind: StructuredOutputKind
    text: str


@dataclass(frozen=True, eq=False)
class StructuredOutputsParams:
    """Exactly one constraint on a request's generated text.

    json: a JSON schema, as a dict, a JSON string, or a pydantic model class (its
        `model_json_schema()` is used); the output is one JSON value matching it.
    regex: the whole output matches this regex (Rust `regex` crate syntax: no look-around,
        no back-references).
    choice: the output is exactly one of these strings.
    grammar: a Lark grammar in llguidance's dialect, or a GBNF grammar (llama.cpp's
        syntax, converted to Lark); the output is a sentence of its `start` (GBNF: `root`).
    json_object: True for any JSON object.
    disable_any_whitespace: with json, no whitespace outside strings (compact JSON); by
        default the schema allows any whitespace between tokens, as JSON does. vLLM's
        option; the same as `"x-guidance": {"whitespace_flexible": false}` in the schema,
        which is how the spec key holds it.

    Equality and hashing follow spec_key(), so two params that ask for the same constraint
    (a schema given as a dict or as its JSON text, in any layout) compare equal.
    """

    json: str | dict[str, Any] | type | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    _spec: StructuredOutputSpec = field(init=False, repr=False)

    def __post_init__(self) -> None:
        given = [kind for kind in _KINDS if self._is_set(kind)]
        if len(given) != 1:
            raise ValueError(
                "structured outputs need exactly one of json, regex, choice, grammar, "
                f"json_object; got {'none' if not given else ', '.join(given)}"
            )
        if not isinstance(self.disable_any_whitespace, bool):
            raise TypeError(
                "disable_any_whitespace must be a bool, "
                f"got {type(self.disable_any_whitespace).__name__}"
            )
        if self.disable_any_whitespace and given[0] != "json":
            raise ValueError(f"disable_any_whitespace applies to json only, not {given[0]}")
        # Computed once here: it validates every field, and the instance is frozen.
        spec = _spec_of(given[0], getattr(self, given[0]), self.disable_any_whitespace)
        object.__setattr__(self, "_spec", spec)

    def _is_set(self, kind: StructuredOutputKind) -> bool:
        value = getattr(self, kind)
        if kind == "json_object":
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"json_object must be a bool, got {type(value).__name__}")
            return bool(value)  # json_object=False asks for nothing
        return value is not None

    @property
    def kind(self) -> StructuredOutputKind:
        return self._spec.kind

    def spec_key(self) -> StructuredOutputSpec:
        """(kind, normalized text): the key of the compile cache, and plain data that can
        cross a process boundary in place of these params."""
        return self._spec

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StructuredOutputsParams):
            return NotImplemented
        return self._spec == other._spec

    def __hash__(self) -> int:
        return hash(self._spec)


def _spec_of(
    kind: StructuredOutputKind, value: Any, disable_any_whitespace: bool = False
) -> StructuredOutputSpec:
    if kind == "json":
        return StructuredOutputSpec("json", _schema_text(value, disable_any_whitespace))
    if kind == "choice":
        return StructuredOutputSpec("choice", _choice_text(value))
    if kind == "json_object":
        return StructuredOutputSpec("json_object", "")
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, got {type(value).__name__}")
    if kind == "grammar" and not value.strip():
        raise ValueError("grammar must not be empty")
    return StructuredOutputSpec(kind, value)


def _schema_text(schema: Any, disable_any_whitespace: bool = False) -> str:
    """A JSON schema (dict, JSON text, or pydantic model class) as canonical JSON text;
    disable_any_whitespace sets llguidance's whitespace_flexible to false in it."""
    if isinstance(schema, type):
        if not callable(getattr(schema, "model_json_schema", None)):
            raise TypeError(
                f"json must be a JSON schema (dict or str) or a pydantic model class; "
                f"{schema.__name__} has no model_json_schema()"
            )
        schema = schema.model_json_schema()
    elif isinstance(schema, str):
        try:
            schema = loads(schema)
        except JSONDecodeError as e:
            raise ValueError(f"json schema is not valid JSON: {e}") from None
    elif not isinstance(schema, dict):
        raise TypeError(
            f"json must be a JSON schema (dict or str) or a pydantic model class, "
            f"got {type(schema).__name__}"
        )
    if not isinstance(schema, dict):
        raise ValueError(f"json schema must be a JSON object, got {dumps(schema)[:80]}")
    check_schema_limits(schema)  # first: a schema past them costs no more work
    try:
        schema = _integral_counts(schema)
    except RecursionError:
        raise ValueError("json schema is nested too deeply") from None
    if disable_any_whitespace:
        options = schema.get("x-guidance", {})
        if not isinstance(options, dict):
            raise ValueError(f"json schema's x-guidance must be an object, got {options!r}")
        schema = {**schema, "x-guidance": {**options, "whitespace_flexible": False}}
    try:
        return dumps(schema, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"json schema is not serializable as JSON: {e}") from None


# Keywords whose value is a non-negative integer, which JSON Schema lets a number with a zero
# fraction be (2.0); llguidance reads only integers there.
_COUNT_KEYWORDS = frozenset(
    ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
     "minContains", "maxContains")
)  # fmt: skip


def _integral_counts(node: Any) -> Any:
    """node with every count keyword's integral float (2.0) as an int, at any depth."""
    if isinstance(node, dict):
        return {
            key: int(value)
            if key in _COUNT_KEYWORDS and isinstance(value, float) and value.is_integer()
            else _integral_counts(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_integral_counts(item) for item in node]
    return node


def _choice_text(choices: Any) -> str:
    if isinstance(choices, str) or not isinstance(choices, (list, tuple)):
        raise TypeError(f"choice must be a list of strings, got {type(choices).__name__}")
    if not choices:
        raise ValueError("choice must list at least one string")
    bad = [c for c in choices if not isinstance(c, str)]
    if bad:
        raise TypeError(f"choice must be a list of strings; {bad[0]!r} is not a string")
    return dumps(list(choices))
