"""Structured outputs: constrain a request's output to a JSON schema, regex, choice or
grammar by masking the logits of disallowed tokens at each step."""

from minivllm.structured_output.backend import (
    CompiledGrammar,
    GrammarMatcher,
    StructuredOutputBackend,
)
from minivllm.structured_output.bitmask import allocate_bitmask, apply_bitmask, num_bitmask_words
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
