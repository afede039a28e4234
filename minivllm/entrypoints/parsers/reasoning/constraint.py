"""A structured-output constraint that starts after the reasoning: one Lark grammar that
admits free text up to and including `</think>`, then the constraint. Where the output
starts (inside a think block the prompt opened, before an optional one, or with reasoning
off) comes from the prompt and the request's chat_template_kwargs."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from llguidance.gbnf_to_lark import any_to_lark

from minivllm.entrypoints.parsers.reasoning.think import END, START, prompt_opens_reasoning
from minivllm.structured_output.grammar_text import choice_lark
from minivllm.structured_output.params import StructuredOutputsParams

# off: the constraint holds from the first token; inside: the output starts inside a think
# block (the prompt opened it); may_open: the output may start with a think block.
ReasoningStart = Literal["off", "inside", "may_open"]

_PREFIX = "minivllm_"  # of this grammar's rule names, kept apart from a user grammar's
_LARK_TOKEN = re.compile(
    r'"(?:[^"\\\n]|\\.)*"'  # a string (and the strings of %json and %regex bodies)
    r"|/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*"  # a regex literal
    r"|(?://|#)[^\n]*"  # a comment
    r"|<[^<>\s]+>"  # a special token
    r"|[A-Za-z_][A-Za-z0-9_-]*"  # a name
)


def reasoning_start(
    reasoning_parser: str | None, prompt: str, template_kwargs: dict[str, Any] | None
) -> ReasoningStart:
    """Off without a reasoning parser, with enable_thinking false, or when the prompt ends
    with a closed think block (a template that turned thinking off itself)."""
    if reasoning_parser is None or (template_kwargs or {}).get("enable_thinking") is False:
        return "off"
    if prompt.rstrip().endswith(END):
        return "off"
    return "inside" if prompt_opens_reasoning(prompt) else "may_open"


def has_special_markers(tokenizer: Any) -> bool:
    """Whether `<think>` and `</think>` are special tokens of tokenizer (else they are text,
    as in Qwen3's and DeepSeek-R1's tokenizers)."""
    specials = set(getattr(tokenizer, "all_special_tokens", ()))
    return START in specials and END in specials


def after_reasoning(
    params: StructuredOutputsParams, start: ReasoningStart, special_markers: bool
) -> StructuredOutputsParams:
    """params as they stand for "off"; else a grammar of free reasoning text ending with
    `</think>` (after `<think>`, optional, for "may_open"), then params' constraint.
    special_markers: the tokenizer has `<think>` and `</think>` as special tokens (referred to
    as tokens; else they are text)."""
    if start == "off":
        return params
    if special_markers:  # a regex never matches a special token: it ends at </think>
        think = f"{START} {_PREFIX}thought"
        thought = f"{_PREFIX}thought: /(?s:.*)/ {END}"
    else:  # lazy: the thought ends at its first </think> (the regex could run past it)
        think = f"{json.dumps(START)} {_PREFIX}thought"
        thought = f"{_PREFIX}thought[lazy]: " + r"/(?s:.*)<\/think>/"
    head = f"{_PREFIX}thought" if start == "inside" else f"{_PREFIX}think?"
    lines = [
        f"start: {head} {_PREFIX}constraint",
        f"{_PREFIX}think: {think}",
        thought,
        f"{_PREFIX}constraint: {_constraint_body(params)}",
    ]
    if params.kind == "grammar":
        lines.append(_renamed_start(any_to_lark(params.grammar)))
    return StructuredOutputsParams(grammar="\n".join(lines) + "\n")


def _constraint_body(params: StructuredOutputsParams) -> str:
    """The constraint as the body of a Lark rule."""
    spec = params.spec_key()
    if spec.kind == "json":
        return f"%json {spec.text}"
    if spec.kind == "json_object":
        return '%json {"type": "object"}'
    if spec.kind == "choice":
        return choice_lark(json.loads(spec.text))
    if spec.kind == "regex":
        return _regex_literal(spec.text)
    return f"{_PREFIX}start"


def _regex_literal(regex: str) -> str:
    """regex as a Lark /.../ literal: its slashes and line breaks escaped."""
    out, escaped = [], False
    for ch in regex:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        else:
            out.append({"/": r"\/", "\n": r"\n", "\r": r"\r"}.get(ch, ch))
    return "/" + "".join(out) + "/"


def _renamed_start(lark: str) -> str:
    """A Lark grammar with its rule `start` renamed (names only: not inside strings,
    regexes, comments or special tokens)."""
    return _LARK_TOKEN.sub(
        lambda m: _PREFIX + "start" if m.group(0) == "start" else m.group(0), lark
    )
