"""A spec as llguidance's grammar text (its JSON form): the one place that knows llguidance's
dialect for each kind of constraint."""

from __future__ import annotations

from collections.abc import Sequence
from json import loads

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from minivllm.structured_output.params import StructuredOutputSpec

# Characters a Rust regex (llguidance's lexer) reads as syntax, and Lark's /.../ delimiter.
_REGEX_SYNTAX = frozenset("\\.+*?()|[]{}^$#&-~/")
_REGEX_CONTROL = {"\n": r"\n", "\r": r"\r", "\t": r"\t"}


def choice_lark(choices: Sequence[str]) -> str:
    """The choices as one Lark regex lexeme, /(?:a|b|...)/. One lexeme, not a rule of one
    alternative per string: the lexer's automaton has no limit on the number of strings,
    while a rule's row of alternatives stops at llguidance's 2,000 items."""
    escaped = (
        "".join("\\" + ch if ch in _REGEX_SYNTAX else _REGEX_CONTROL.get(ch, ch) for ch in text)
        for text in choices
    )
    return "/(?:" + "|".join(escaped) + ")/"


def grammar_text(spec: StructuredOutputSpec) -> str:
    """The llguidance grammar (its JSON form) of a spec; a GBNF grammar that does not
    convert to Lark is a ValueError. Other errors surface when the matcher is built."""
    if spec.kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(spec.text)
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}')
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    if spec.kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark(f"start: {choice_lark(loads(spec.text))}")
    try:
        lark = any_to_lark(spec.text)  # Lark text passes through unchanged
    except Exception as e:  # the converter raises its own error types
        raise ValueError(f"invalid structured output grammar (GBNF): {e}") from None
    return llguidance.LLMatcher.grammar_from_lark(lark)
