"""LLM(...) on the tiny Qwen3.5-MoE checkpoint (hybrid layers, each MLP routed experts and a
sigmoid-gated shared expert) against HF transformers' float32 forward under teacher forcing:
every greedy token is HF's argmax and every chosen-token logprob is HF's to 1e-4, batched, one
prompt at a time and with chunked prefill; the conditional-generation checkpoint (vision tower
beside, as transformers saves it) loads its text path, and so do experts stored fused; the
config fields."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

from minivllm import LLM, model_loader
from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.layers.moe import SharedExpertMoeBlock
from minivllm.model_loader import build_model
from minivllm.models.model_config import ModelConfig
from minivllm.models.moe_config import MoeConfig
from minivllm.tiny_model import make_dummy_model_dir
from tests.models.hf_greedy import (
    assert_batched_and_alone_match_hf,
    assert_greedy_matches_hf,
    cpu_llm,
    greedy_outputs,
)

PROMPTS = [
    [5, 17, 42, 99, 3],
    [7] * 13 + [8, 9],
    list(range(20, 90)),  # 70 tokens: past one 64-token chunk of the gated delta rule
    [11],
    list(range(400, 310, -1)),
]
MAX_TOKENS = 8
LOGPROB_TOL = 1e-4
# A vision tower as small as transformers allows: its tensors are in the checkpoint, not run.
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_5_moe_dir: str):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_5_moe_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def conditional_generation_dir(tiny_qwen3_5_moe_dir: str, hf_model, tmp_path_factory) -> str:
    """transformers' Qwen3_5MoeForConditionalGeneration holding the tiny decoder's weights and
    a random vision tower, as save_pretrained writes it (decoder under model.language_model.,
    text_config nested)."""
    with open(os.path.join(tiny_qwen3_5_moe_dir, "config.json")) as f:
        text_config = json.load(f)
    config = Qwen3_5MoeConfig(text_config=text_config, vision_config=TINY_VISION)
    config.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    torch.manual_seed(0)
    model = Qwen3_5MoeForConditionalGeneration(config)
    model.model.language_model.load_state_dict(hf_model.model.state_dict())
    model.lm_head.load_state_dict(hf_model.lm_head.state_dict())
    out_dir = str(tmp_path_factory.mktemp("tiny-qwen3-5-moe-cg"))
    model.save_pretrained(out_dir)
    for name in os.listdir(tiny_qwen3_5_moe_dir):
        if name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(os.path.join(tiny_qwen3_5_moe_dir, name), out_dir)
    return out_dir


make_llm = cpu_llm


def generate(llm: LLM, prompts: list[list[int]]) -> list:
    return greedy_outputs(llm, prompts, MAX_TOKENS)


def assert_matches_hf(hf_model, prompts: list[list[int]], completions: list) -> None:
    assert_greedy_matches_hf(hf_model, prompts, completions, MAX_TOKENS, LOGPROB_TOL)


def test_config_and_layers(tiny_qwen3_5_moe_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_5_moe_dir)
    assert config.architecture == "Qwen3_5MoeForCausalLM" and config.intermediate_size == 0
    # No norm_topk_prob in config.json: transformers' router always renormalizes.
    assert config.moe == MoeConfig(8, 2, 32, True, shared_expert_intermediate_size=48)
    assert config.linear_attention.num_linear_layers == 3
    model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", load_format="dummy")
    mlps = [layer.mlp for layer in model.model.layers]
    assert all(type(mlp) is SharedExpertMoeBlock for mlp in mlps)
    assert mlps[0].experts.gate_up_proj.shape == (8, 64, 64)
    assert mlps[0].shared_expert.gate_up_proj.weight.shape == (96, 64)
    assert mlps[0].shared_expert_gate.weight.shape == (1, 64)


def test_norm_topk_prob_false_in_config_is_read(tiny_qwen3_5_moe_dir: str) -> None:
    with open(os.path.join(tiny_qwen3_5_moe_dir, "config.json")) as f:
        hf = json.load(f)
    assert not ModelConfig.from_dict({**hf, "norm_topk_prob": False}).moe.norm_topk_prob
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        ModelConfig.from_dict({**hf, "shared_expert_intermediate_size": -1})


def test_batched_and_alone_match_hf(tiny_qwen3_5_moe_dir: str, hf_model) -> None:
    assert_batched_and_alone_match_hf(
        make_llm(tiny_qwen3_5_moe_dir), hf_model, PROMPTS, MAX_TOKENS, LOGPROB_TOL
    )


@pytest.mark.parametrize("max_num_batched_tokens", [24, 40])
def test_chunked_prefill_matches_hf(
    tiny_qwen3_5_moe_dir: str, hf_model, max_num_batched_tokens: int
) -> None:
    llm = make_llm(tiny_qwen3_5_moe_dir, max_num_batched_tokens=max_num_batched_tokens)
    assert_matches_hf(hf_model, PROMPTS, generate(llm, PROMPTS))


def test_conditional_generation_checkpoint_matches_hf(
    conditional_generation_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    with safe_open(os.path.join(conditional_generation_dir, "model.safetensors"), "pt") as f:
        names = list(f.keys())
    num_visual = sum(name.startswith("model.visual.") for name in names)
    assert num_visual > 0 and "model.language_model.layers.0.mlp.experts.7.up_proj.weight" in names
    assert ModelConfig.from_hf(conditional_generation_dir).moe.shared_expert_intermediate_size
    with caplog.at_level(logging.INFO, logger="minivllm.model_loader"):
        llm = make_llm(conditional_generation_dir)
    assert f"not loaded: {num_visual} checkpoint tensors under mtp., model.visual." in caplog.text
    hf_cg = Qwen3_5MoeForConditionalGeneration.from_pretrained(
        conditional_generation_dir, dtype=torch.float32
    ).eval()
    prompts = PROMPTS[:3]
    assert_matches_hf(hf_cg, prompts, generate(llm, prompts))


def fused_experts_dir(model_dir: str, out_dir: str) -> str:
    """The checkpoint with each layer's experts as transformers 5 holds them in memory:
    experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]."""
    shutil.copytree(model_dir, out_dir)
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    for layer in range(4):
        prefix = f"model.layers.{layer}.mlp.experts"
        parts = {
            part: torch.stack([tensors.pop(f"{prefix}.{e}.{part}.weight") for e in range(8)])
            for part in ("gate_proj", "up_proj", "down_proj")
        }
        tensors[f"{prefix}.gate_up_proj"] = torch.cat([parts["gate_proj"], parts["up_proj"]], 1)
        tensors[f"{prefix}.down_proj"] = parts["down_proj"]
    save_file(tensors, path, metadata={"format": "pt"})
    return out_dir


def test_fused_expert_tensors_load(tiny_qwen3_5_moe_dir: str, hf_model, tmp_path) -> None:
    fused = fused_experts_dir(tiny_qwen3_5_moe_dir, str(tmp_path / "fused"))
    prompts = PROMPTS[:3]
    assert_matches_hf(hf_model, prompts, generate(make_llm(fused), prompts))


def test_triton_kernels_match_hf(
    tiny_qwen3_5_moe_dir: str, hf_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's path in Triton's interpreter: the router and fused-MoE kernels beside the
    gated-delta, conv and attention kernels."""
    monkeypatch.setattr(model_loader, "use_triton_kernels", lambda device: True)
    llm = make_llm(tiny_qwen3_5_moe_dir, max_num_batched_tokens=24, attention_backend="triton")
    assert llm.engine.executor.runner.model.model.layers[0].mlp.experts.use_triton
    prompts = PROMPTS[:2]
    assert_matches_hf(hf_model, prompts, generate(llm, prompts))


def test_shipped_qwen3_5_35b_a3b_config(tmp_path) -> None:
    """The weightless directory the GPU benchmarks run with load_format="dummy"."""
    config = ModelConfig.from_hf(make_dummy_model_dir("qwen3.5-35b-a3b", str(tmp_path)))
    assert config.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert config.num_hidden_layers == 40 and config.num_kv_layers == 10
    assert config.moe == MoeConfig(256, 8, 512, True, shared_expert_intermediate_size=512)
