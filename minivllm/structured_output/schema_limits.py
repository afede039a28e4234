"""The limits a JSON schema must keep before it is compiled, checked by a walk of its nodes:
what the grammar engine would take too long to build (and a compiling thread cannot be
stopped) is refused at once, naming the limit and where in the schema it was passed."""

from __future__ import annotations

from typing import Any

# Optional properties (listed in an object's `properties`, not in its `required`) in any one
# object. llguidance's conversion of a JSON schema grows with their square and nothing stops
# it (on one core, after a required one: 1,000 take 0.2 s, 0.33 s on SmolLM2's vocabulary;
# 2,000 0.8 s; 8,000 about 8 s); within MAX_SPEC_BYTES, ten objects at this limit build for
# about 2.5 s (docs/structured_outputs.md, "Compiling").
MAX_OPTIONAL_PROPERTIES = 1000


def check_schema_limits(schema: dict[str, Any]) -> None:
    """ValueError naming the limit and the object (a JSON pointer) where some object of
    schema, at any depth, has more than MAX_OPTIONAL_PROPERTIES optional properties."""
    # (node, its path as a linked list (parent's path, key)): a pointer is spelt out only
    # for an object refused. No recursion: the schema's depth is the client's choice.
    stack: list[tuple[Any, tuple | None]] = [(schema, None)]
    seen: set[int] = set()  # a dict given twice (or in a cycle) is checked once
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict | list):
            if id(node) in seen:
                continue
            seen.add(id(node))
        if isinstance(node, dict):
            _check_object(node, path)
            stack += [(value, (path, key)) for key, value in node.items()]
        elif isinstance(node, list):
            stack += [(item, (path, i)) for i, item in enumerate(node)]


def _check_object(node: dict[str, Any], path: tuple | None) -> None:
    properties = node.get("properties")
    if not isinstance(properties, dict) or len(properties) <= MAX_OPTIONAL_PROPERTIES:
        return
    required = node.get("required")
    names = (
        {name for name in required if isinstance(name, str)}
        if isinstance(required, list)
        else set()
    )
    num_optional = sum(1 for name in properties if name not in names)
    if num_optional > MAX_OPTIONAL_PROPERTIES:
        raise ValueError(
            f"json schema: the object at {_pointer(path)} has {num_optional:,} optional properties "
            f"(not in its required), more than the grammar engine's limit of "
            f"{MAX_OPTIONAL_PROPERTIES:,} (MAX_OPTIONAL_PROPERTIES: its compile time grows "
            "with their square); make some of them required or split the object"
        )


def _pointer(path: tuple | None) -> str:
    """path as a JSON pointer in a URI fragment: "#" (the root), "#/properties/a", ..."""
    keys: list[str] = []
    while path is not None:
        path, key = path
        keys.append(str(key).replace("~", "~0").replace("/", "~1"))  # RFC 6901
    return "#" + "".join(f"/{key}" for key in reversed(keys))
