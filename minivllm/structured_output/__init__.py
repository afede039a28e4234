"""Structured outputs: constrain a request's output to a JSON schema, regex, choice or
grammar by masking the logits of disallowed tokens at each step."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Where each name lives, imported on first use: the command line's --help and the engine's
# config read a submodule (params, config) without importing torch through this package.
_WHERE = {
    "CompiledGrammar": "minivllm.structured_output.backend",
    "GrammarMatcher": "minivllm.structured_output.backend",
    "StructuredOutputBackend": "minivllm.structured_output.backend",
    "allocate_bitmask": "minivllm.structured_output.bitmask",
    "apply_bitmask": "minivllm.structured_output.bitmask",
    "num_bitmask_words": "minivllm.structured_output.bitmask",
    "CompileCacheInfo": "minivllm.structured_output.compiler",
    "GrammarCompiler": "minivllm.structured_output.compiler",
    "StructuredOutputKind": "minivllm.structured_output.params",
    "StructuredOutputsParams": "minivllm.structured_output.params",
    "StructuredOutputSpec": "minivllm.structured_output.params",
    "GrammarViolation": "minivllm.structured_output.request_state",
    "StructuredOutputRequest": "minivllm.structured_output.request_state",
}

if TYPE_CHECKING:
    from minivllm.structured_output.backend import (
        CompiledGrammar,
        GrammarMatcher,
        StructuredOutputBackend,
    )
    from minivllm.structured_output.bitmask import (
        allocate_bitmask,
        apply_bitmask,
        num_bitmask_words,
    )
    from minivllm.structured_output.compiler import CompileCacheInfo, GrammarCompiler
    from minivllm.structured_output.params import (
        StructuredOutputKind,
        StructuredOutputsParams,
        StructuredOutputSpec,
    )
    from minivllm.structured_output.request_state import GrammarViolation, StructuredOutputRequest


__all__ = [
    "CompileCacheInfo",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarMatcher",
    "GrammarViolation",
    "StructuredOutputBackend",
    "StructuredOutputKind",
    "StructuredOutputRequest",
    "StructuredOutputSpec",
    "StructuredOutputsParams",
    "allocate_bitmask",
    "apply_bitmask",
    "num_bitmask_words",
]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
