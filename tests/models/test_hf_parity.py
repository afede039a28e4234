"""Model-level parity with HF transformers: packed ragged prefill logits, fp32."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.model_loader import build_model
from minivllm.models.model_config import ModelConfig
from minivllm.models.registry import get_model_class
from tests.helpers import prefill_logits

# Ragged lengths that straddle block boundaries (block_size 4); one long enough that the
# llama3-scaled low frequencies matter.
PROMPT_LENS = (7, 1, 70)


def make_prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def test_prefill_logits_match_hf(tiny_model_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_model_dir)
    model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", tiny_model_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = make_prompts(config.vocab_size)

    ours = prefill_logits(model, prompts, block_size=4)
    for prompt, logits in zip(prompts, ours, strict=True):
        with torch.no_grad():
            expected = hf_model(torch.tensor([prompt])).logits[0]
        assert logits.shape == expected.shape == (len(prompt), config.vocab_size)
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    # The tiny weights make real predictions, not near-ties: greedy choices must be clear.
    top2 = ours[2].topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).max() > 1e-2


def test_batching_does_not_change_logits(tiny_qwen3_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_dir)
    model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", tiny_qwen3_dir)
    prompts = make_prompts(config.vocab_size)
    batched = prefill_logits(model, prompts, block_size=8)
    for prompt, logits in zip(prompts, batched, strict=True):
        (alone,) = prefill_logits(model, [prompt], block_size=16)
        torch.testing.assert_close(logits, alone, atol=1e-5, rtol=1e-5)


def test_unknown_architecture_is_a_clear_error(tiny_qwen3_dir: str) -> None:
    with pytest.raises(ValueError, match="MistralForCausalLM.*Qwen3ForCausalLM"):
        get_model_class("MistralForCausalLM")
    config = dataclasses.replace(ModelConfig.from_hf(tiny_qwen3_dir), architecture="Gpt2Model")
    with pytest.raises(ValueError, match="Gpt2Model.*LlamaForCausalLM"):
        build_model(config, TorchSDPABackend(), torch.float32, "cpu", tiny_qwen3_dir)


def test_unsupported_rope_type_is_a_clear_error(tiny_qwen3_dir: str) -> None:
    config = dataclasses.replace(
        ModelConfig.from_hf(tiny_qwen3_dir), rope_scaling={"rope_type": "yarn", "factor": 4.0}
    )
    with pytest.raises(ValueError, match="'yarn'.*llama3"):
        build_model(config, TorchSDPABackend(), torch.float32, "cpu", load_format="dummy")


def test_bfloat16_close_to_fp32(tiny_llama_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_llama_dir)
    prompts = make_prompts(config.vocab_size)
    ref = build_model(config, TorchSDPABackend(), torch.float32, "cpu", tiny_llama_dir)
    low = build_model(config, TorchSDPABackend(), torch.bfloat16, "cpu", tiny_llama_dir)
    assert all(p.dtype == torch.bfloat16 for p in low.parameters())
    for a, b in zip(prefill_logits(ref, prompts), prefill_logits(low, prompts), strict=True):
        torch.testing.assert_close(b.float(), a, atol=0.1, rtol=0.05)
