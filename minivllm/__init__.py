"""minivllm: a compact, fast, readable LLM inference engine with its own Triton kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig"]

_WHERE = {
    "LLM": "minivllm.entrypoints.llm",
    "SamplingParams": "minivllm.sampling_params",
    "RequestOutput": "minivllm.outputs",
    "CompletionOutput": "minivllm.outputs",
    "EngineConfig": "minivllm.config",
}

if TYPE_CHECKING:
    from minivllm.config import EngineConfig
    from minivllm.entrypoints.llm import LLM
    from minivllm.outputs import CompletionOutput, RequestOutput
    from minivllm.sampling_params import SamplingParams


def __getattr__(name: str):
    # Lazy, so that `import minivllm.engine.types` does not pull in torch models and triton.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
