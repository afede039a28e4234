"""Qwen3.5 (hybrid Gated DeltaNet + gated attention) against HF transformers, model level:
packed ragged prefill logits in fp32, the conditional-generation checkpoint layout, config
errors."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.model_loader import build_model
from minivllm.models.model_config import ModelConfig
from tests.helpers import hybrid_prefill_logits

# Ragged lengths across the 64-token chunks of the gated delta rule and the 4-token blocks.
PROMPT_LENS = (7, 1, 70, 130)


def make_prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def test_prefill_logits_match_hf(tiny_qwen3_5_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_5_dir)
    assert config.linear_attention.num_linear_layers == 3 and config.partial_rotary_factor == 0.25
    model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", tiny_qwen3_5_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_5_dir, dtype=torch.float32).eval()
    prompts = make_prompts(config.vocab_size)
    for prompt, logits in zip(prompts, hybrid_prefill_logits(model, prompts), strict=True):
        with torch.no_grad():
            expected = hf_model(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def conditional_generation_dir(text_dir: str, out_dir: str) -> str:
    """The tiny checkpoint laid out as Qwen3_5ForConditionalGeneration: the decoder under
    model.language_model., a vision tower and an MTP head beside, text_config nested."""
    os.makedirs(out_dir, exist_ok=True)
    tensors = load_file(os.path.join(text_dir, "model.safetensors"))
    renamed = {name.replace("model.", "model.language_model.", 1): t for name, t in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 4)
    renamed["mtp.fc.weight"] = torch.zeros(4, 4)
    save_file(renamed, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(text_dir, "config.json")) as f:
        text_config = json.load(f)
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text_config}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)
    return out_dir


def test_conditional_generation_checkpoint_loads_the_text_path(
    tiny_qwen3_5_dir: str, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    cg_dir = conditional_generation_dir(tiny_qwen3_5_dir, str(tmp_path / "cg"))
    cg_config = ModelConfig.from_hf(cg_dir)
    assert cg_config.architecture == "Qwen3_5ForConditionalGeneration"
    text_config = ModelConfig.from_hf(tiny_qwen3_5_dir)
    with caplog.at_level(logging.INFO, logger="minivllm.model_loader"):
        ours = build_model(cg_config, TorchSDPABackend(), torch.float32, "cpu", cg_dir)
    assert "not loaded: 2 checkpoint tensors under mtp., model.visual." in caplog.text
    ref = build_model(text_config, TorchSDPABackend(), torch.float32, "cpu", tiny_qwen3_5_dir)
    prompts = make_prompts(text_config.vocab_size)[:2]
    for a, b in zip(hybrid_prefill_logits(ours, prompts), hybrid_prefill_logits(ref, prompts)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_missing_linear_attention_field_is_a_clear_error(tiny_qwen3_5_dir: str) -> None:
    with open(os.path.join(tiny_qwen3_5_dir, "config.json")) as f:
        hf = json.load(f)
    del hf["linear_num_value_heads"]
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        ModelConfig.from_dict(hf)
    with pytest.raises(ValueError, match="text_config"):
        ModelConfig.from_dict({"architectures": ["Qwen3_5ForConditionalGeneration"]})
