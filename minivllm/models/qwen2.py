"""Qwen2 (and Qwen2.5): Llama with biases on the q/k/v projections."""

from __future__ import annotations

from minivllm.models.llama import DecoderOptions, LlamaForCausalLM
from minivllm.models.model_config import ModelConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def decoder_options(cls, config: ModelConfig) -> DecoderOptions:
        # HF's Qwen2 always has q/k/v biases and never an o_proj bias, whatever the config says.
        return DecoderOptions(qkv_bias=True, o_bias=False, qk_norm=False)
