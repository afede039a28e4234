"""The lazy model registry: listing and checking architectures imports no model; a class is
imported when asked for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minivllm.models.registry import check_architecture, get_model_class, supported_architectures

_PROBE = """
import sys
from minivllm.models.model_config import ModelConfig
from minivllm.models.registry import check_architecture, supported_architectures
supported_architectures()
check_architecture("Qwen3ForCausalLM")
ModelConfig.from_dict({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 8, "hidden_size": 8,
                       "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})
print(sorted(m for m in sys.modules if m.startswith("minivllm.models.")))
"""


def test_listing_and_checking_import_no_model() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True
    ).stdout
    # moe_config and hybrid_config hold ModelConfig's MoE and linear-attention fields: config,
    # not a model.
    expected = [
        "minivllm.models.hybrid_config",
        "minivllm.models.model_config",
        "minivllm.models.moe_config",
        "minivllm.models.registry",
    ]
    assert out.strip() == str(expected)


def test_class_imported_on_use() -> None:
    assert supported_architectures() == [
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
    ]
    for architecture in supported_architectures():
        check_architecture(architecture)
        assert get_model_class(architecture).__name__ == architecture
    with pytest.raises(ValueError, match="unsupported model architecture 'Gpt2'.*Llama"):
        check_architecture("Gpt2")
