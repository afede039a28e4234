"""The explicit map from a config.json architecture name to its model class, imported on use:
listing or checking architectures imports no model."""

from __future__ import annotations

import importlib

from torch import nn

# Architecture -> (module under minivllm.models, class name).
_MODELS: dict[str, tuple[str, str]] = {
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen3_5ForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def check_architecture(architecture: str) -> None:
    """Raises ValueError naming the supported architectures for an unknown one."""
    if architecture not in _MODELS:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; "
            f"supported architectures: {supported_architectures()}"
        )


def get_model_class(architecture: str) -> type[nn.Module]:
    """Imports the architecture's module and returns its class; unknown is a ValueError."""
    check_architecture(architecture)
    module_name, class_name = _MODELS[architecture]
    module = importlib.import_module(f"minivllm.models.{module_name}")
    return getattr(module, class_name)
