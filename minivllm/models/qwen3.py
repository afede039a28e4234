"""Qwen3: Llama without biases, plus a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from minivllm.config import ModelConfig
from minivllm.models.llama import DecoderOptions, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config: ModelConfig) -> DecoderOptions:
        return DecoderOptions(config.attention_bias, config.attention_bias, qk_norm=True)
