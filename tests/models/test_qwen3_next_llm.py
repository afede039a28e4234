"""LLM(...) on the tiny Qwen3-Next checkpoint (Qwen3.5-MoE's layers, its Gated DeltaNet
in-projections fused per key head, a dense MLP in layer 1) against HF transformers' float32
forward under teacher forcing: greedy tokens HF's argmax, chosen-token logprobs HF's to 1e-4,
batched, alone and chunked; the in-projection split against HF's own reordering."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.layers.gated_delta_weights import split_ba, split_qkvz
from minivllm.layers.moe import SharedExpertMoeBlock
from minivllm.model_loader import build_model
from minivllm.models.llama import DecoderMLP
from minivllm.models.model_config import ModelConfig
from minivllm.models.moe_config import MoeConfig
from tests.models.hf_greedy import (
    assert_greedy_matches_hf,
    cpu_llm,
    greedy_outputs,
)

PROMPTS = [
    [5, 17, 42, 99, 3],
    [7] * 13 + [8, 9],
    list(range(20, 90)),  # 70 tokens: past one 64-token chunk of the gated delta rule
    [11],
]
MAX_TOKENS = 8
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_next_dir: str):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_next_dir, dtype=torch.float32).eval()


make_llm = cpu_llm


def assert_matches_hf(hf_model, prompts: list[list[int]], completions: list) -> None:
    assert_greedy_matches_hf(hf_model, prompts, completions, MAX_TOKENS, LOGPROB_TOL)


def test_in_projection_split_matches_hf_reordering() -> None:
    """Two value heads per key head: q, k, v, z, b, a from the split weights equal HF's
    fix_query_key_value_ordering of the fused projections' outputs."""
    config = Qwen3NextConfig(
        hidden_size=24, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=3, linear_value_head_dim=5,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = Qwen3NextGatedDeltaNet(config, layer_idx=0)
    x = torch.randn(1, 6, 24)
    with torch.no_grad():
        q, k, v, z, b, a = hf.fix_query_key_value_ordering(hf.in_proj_qkvz(x), hf.in_proj_ba(x))
    qkv_w, z_w = split_qkvz(hf.in_proj_qkvz.weight.detach(), 2, 4, 3, 5)
    b_w, a_w = split_ba(hf.in_proj_ba.weight.detach(), 2, 4)
    expected_qkv = torch.cat([t.flatten(2) for t in (q, k, v)], dim=-1)
    torch.testing.assert_close(x @ qkv_w.T, expected_qkv)
    torch.testing.assert_close(x @ z_w.T, z.flatten(2))
    torch.testing.assert_close(x @ b_w.T, b)
    torch.testing.assert_close(x @ a_w.T, a)
    with pytest.raises(ValueError, match="in_proj_qkvz.weight has shape"):
        split_qkvz(qkv_w, 2, 4, 3, 5)


def test_config_and_layers(tiny_qwen3_next_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_next_dir)
    assert config.architecture == "Qwen3NextForCausalLM" and config.intermediate_size == 128
    assert config.moe == MoeConfig(8, 2, 32, True, 1, (1,), 48)
    model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", load_format="dummy")
    mlps = [type(layer.mlp) for layer in model.model.layers]
    assert mlps == [SharedExpertMoeBlock, DecoderMLP, SharedExpertMoeBlock, SharedExpertMoeBlock]


def test_config_json_of_transformers_4(tiny_qwen3_next_dir: str) -> None:
    """Qwen3-Next's published config.json: partial_rotary_factor at the top level, rope_theta
    beside it, no rope_parameters."""
    with open(os.path.join(tiny_qwen3_next_dir, "config.json")) as f:
        hf = json.load(f)
    rope = hf.pop("rope_parameters")
    hf.update(partial_rotary_factor=rope["partial_rotary_factor"], rope_theta=1e6)
    config = ModelConfig.from_dict(hf)
    assert config.partial_rotary_factor == 0.25 and config.rope_theta == 1e6


def test_batched_and_alone_match_hf(tiny_qwen3_next_dir: str, hf_model) -> None:
    llm = make_llm(tiny_qwen3_next_dir)
    batched = greedy_outputs(llm, PROMPTS, MAX_TOKENS)
    assert_matches_hf(hf_model, PROMPTS, batched)
    alone = [greedy_outputs(llm, [p], MAX_TOKENS)[0] for p in PROMPTS]
    assert_matches_hf(hf_model, PROMPTS, alone)


def test_chunked_prefill_matches_hf(tiny_qwen3_next_dir: str, hf_model) -> None:
    llm = make_llm(tiny_qwen3_next_dir, max_num_batched_tokens=24)
    assert_matches_hf(hf_model, PROMPTS, greedy_outputs(llm, PROMPTS, MAX_TOKENS))
