"""Qwen3: Llama without biases, plus a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from minivllm.models.llama import DecoderOptions, LlamaForCausalLM
from minivllm.models.model_config import ModelConfig


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config: ModelConfig) -> DecoderOptions:
        return DecoderOptions(config.attention_bias, config.attention_bias, qk_norm=True)
