"""The explicit map from a config.json architecture name to its model class."""

from __future__ import annotations

from torch import nn

from minivllm.models.llama import LlamaForCausalLM
from minivllm.models.qwen2 import Qwen2ForCausalLM
from minivllm.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; "
            f"supported architectures: {sorted(MODEL_REGISTRY)}"
        )
    return MODEL_REGISTRY[architecture]
