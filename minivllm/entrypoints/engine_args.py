"""The engine options of the command line: one --flag per EngineConfig field, its type taken
from the field's annotation, and the parsed flags back as EngineConfig keyword options."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from minivllm.config import EngineConfig

# usage_context: set by the command itself (serve: "server"), not a flag.
_SKIP = {"model", "usage_context"}
_SCALARS = (int, float, str)


def _argument_options(name: str, hint: Any) -> dict[str, Any]:
    """argparse.add_argument keywords for a field annotated `hint` (X | None parses as X)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(hint) is typing.Literal:
        return {"choices": typing.get_args(hint)}
    if hint in _SCALARS:
        return {"type": hint}
    raise TypeError(f"EngineConfig.{name}: no command-line form for its type {hint!r}")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """One --flag per EngineConfig field (vLLM's names with dashes); unset flags stay None."""
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name in _SKIP:
            continue
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, default=None, **_argument_options(f.name, hints[f.name]))


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags given on the command line, as EngineConfig keyword options."""
    names = {f.name for f in dataclasses.fields(EngineConfig)} - _SKIP
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
