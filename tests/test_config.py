"""ModelConfig reads config.json as transformers 4 and 5 write it; EngineConfig validates."""

from __future__ import annotations

import pytest

from minivllm.config import EngineConfig
from minivllm.models.model_config import ModelConfig

BASE = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    eos_token_id=[128001, 128008, 128009],
)
LLAMA3_SCALING = dict(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def test_transformers4_and_5_configs_agree() -> None:
    v4 = ModelConfig.from_dict(
        {
            **BASE,
            "rope_theta": 500000.0,
            "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "llama3", **LLAMA3_SCALING},
        }
    )
    v5 = ModelConfig.from_dict(
        {
            **BASE,
            "dtype": "bfloat16",
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING},
        }
    )
    for cfg in (v4, v5):
        assert cfg.rope_theta == 500000.0 and cfg.torch_dtype == "bfloat16"
        assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.rope_scaling["factor"] == 32.0
        assert cfg.head_dim == 64 and cfg.eos_token_ids == (128001, 128008, 128009)


def test_default_rope_and_qwen2_bias() -> None:
    cfg = ModelConfig.from_dict(
        {**BASE, "architectures": ["Qwen2ForCausalLM"], "rope_theta": 1e6, "rope_scaling": None}
    )
    assert cfg.rope_scaling is None and cfg.attention_bias


def test_engine_config_rejects_bad_values(tmp_path) -> None:
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(model=str(tmp_path), block_size=12)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(model=str(tmp_path), gpu_memory_utilization=1.5)
    with pytest.raises(TypeError, match="max_num_sequences"):
        EngineConfig.from_options(str(tmp_path), max_num_sequences=4)
