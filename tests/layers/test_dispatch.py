"""The fused-op dispatch chosen at build time: a model built with use_triton=True (RMSNorm,
Qwen3 q/k norm + RoPE and SiLU-mul as Triton kernels, here in the interpreter) gives the
logits of the torch layers, and the oracle is HF transformers."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.layers.dispatch import use_triton_kernels
from minivllm.model_loader import load_model
from minivllm.models.model_config import ModelConfig
from minivllm.models.registry import get_model_class
from tests.helpers import prefill_logits


def test_triton_layers_match_hf(tiny_qwen3_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_dir)
    model = get_model_class(config.architecture)(
        config, TorchSDPABackend(), torch.float32, use_triton=True
    )
    load_model(model, tiny_qwen3_dir)
    assert model.model.norm.use_triton and model.model.rotary_emb.use_triton
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    prompts = [[5, 17, 42, 99, 3, 8, 1], list(range(40, 53))]
    ours = prefill_logits(model.eval(), prompts, block_size=4)
    for prompt, logits in zip(prompts, ours, strict=True):
        with torch.no_grad():
            expected = hf_model(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_the_rule() -> None:
    assert use_triton_kernels("cuda:1") and not use_triton_kernels(torch.device("cpu"))
