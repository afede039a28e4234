"""Qwen3MoeForCausalLM against HF transformers (float32, packed ragged prefill): the torch path
and the Triton path (fused MoE and the fused ops in the interpreter); stacked-expert loading
and its errors; the MoE config fields."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.layers.fused_moe import FusedMoE
from minivllm.layers.moe import SparseMoeBlock
from minivllm.model_loader import build_model, load_model
from minivllm.models.llama import DecoderMLP
from minivllm.models.model_config import ModelConfig
from minivllm.models.moe_config import MoeConfig
from minivllm.models.registry import get_model_class, supported_architectures
from minivllm.tiny_model import make_dummy_model_dir
from tests.helpers import prefill_logits


def make_prompts(vocab_size: int, lens: tuple[int, ...]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in lens]


def hf_logits(model_dir: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [hf_model(torch.tensor([p])).logits[0] for p in prompts]


def test_config_and_layers(tiny_qwen3_moe_dir: str) -> None:
    assert "Qwen3MoeForCausalLM" in supported_architectures()
    config = ModelConfig.from_hf(tiny_qwen3_moe_dir)
    assert config.moe == MoeConfig(8, 2, 32, True, 1, (1,))
    model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", load_format="dummy")
    mlps = [type(layer.mlp) for layer in model.model.layers]
    assert mlps == [SparseMoeBlock, DecoderMLP, SparseMoeBlock]
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape == (8, 64, 64) and experts.down_proj.shape == (8, 64, 32)


def test_shipped_qwen3_30b_a3b_config(tmp_path) -> None:
    """The weightless directory the GPU benchmarks run with load_format="dummy"."""
    config = ModelConfig.from_hf(make_dummy_model_dir("qwen3-30b-a3b", str(tmp_path)))
    assert config.architecture == "Qwen3MoeForCausalLM" and config.num_hidden_layers == 48
    assert config.moe == MoeConfig(128, 8, 768, True, 1, ())
    assert all(config.moe.is_sparse(i) for i in range(48))


@pytest.mark.parametrize("use_triton", [False, True])
def test_prefill_logits_match_hf(tiny_qwen3_moe_dir: str, use_triton: bool) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_moe_dir)
    model = get_model_class(config.architecture)(
        config, TorchSDPABackend(), torch.float32, use_triton=use_triton
    )
    load_model(model, tiny_qwen3_moe_dir)
    assert model.model.layers[0].mlp.experts.use_triton == use_triton
    # The interpreter runs every fused op a program at a time: shorter prompts there.
    prompts = make_prompts(config.vocab_size, (7, 1, 23) if use_triton else (7, 1, 70))
    ours = prefill_logits(model.eval(), prompts, block_size=4)
    for logits, expected in zip(ours, hf_logits(tiny_qwen3_moe_dir, prompts), strict=True):
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    # Real predictions, not near-ties: greedy choices must be clear.
    top2 = ours[2].topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).max() > 1e-2


def copy_checkpoint(src: str, dst: str, edit) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return dst


def test_missing_and_stray_expert_tensors_are_named(tiny_qwen3_moe_dir: str, tmp_path) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_moe_dir)
    name = "model.layers.2.mlp.experts.5.up_proj.weight"
    missing = copy_checkpoint(tiny_qwen3_moe_dir, str(tmp_path / "missing"),
                              lambda t: t.pop(name))  # fmt: skip
    with pytest.raises(ValueError, match=r"1 weight\(s\) missing.*experts\.5\.up_proj"):
        build_model(config, TorchSDPABackend(), torch.float32, "cpu", missing)
    stray_name = "model.layers.0.mlp.experts.8.gate_proj.weight"  # only 8 experts: 0..7
    stray = copy_checkpoint(tiny_qwen3_moe_dir, str(tmp_path / "stray"),
                            lambda t: t.update({stray_name: t[name].clone()}))  # fmt: skip
    with pytest.raises(ValueError, match=r"experts\.8\.gate_proj.*shard_id"):
        build_model(config, TorchSDPABackend(), torch.float32, "cpu", stray)


def test_every_expert_slice_is_loaded(tiny_qwen3_moe_dir: str) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_moe_dir)
    model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", tiny_qwen3_moe_dir)
    tensors = load_file(os.path.join(tiny_qwen3_moe_dir, "model.safetensors"))
    experts: FusedMoE = model.model.layers[2].mlp.experts
    for e in (0, 7):
        prefix = f"model.layers.2.mlp.experts.{e}"
        gate, up = experts.gate_up_proj[e].chunk(2)
        assert torch.equal(gate, tensors[f"{prefix}.gate_proj.weight"])
        assert torch.equal(up, tensors[f"{prefix}.up_proj.weight"])
        assert torch.equal(experts.down_proj[e], tensors[f"{prefix}.down_proj.weight"])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.pop("num_local_experts"), "no 'num_experts'"),
        (lambda c: c.update(num_experts_per_tok=9), r"num_experts_per_tok \(9\) exceeds"),
        (lambda c: c.update(moe_intermediate_size=0), "moe_intermediate_size must be"),
        (lambda c: c.update(hidden_act="gelu"), "hidden_act 'silu'"),
    ],
)
def test_bad_moe_config_is_a_clear_error(tiny_qwen3_moe_dir: str, edit, message: str) -> None:
    with open(os.path.join(tiny_qwen3_moe_dir, "config.json")) as f:
        hf = json.load(f)
    edit(hf)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(hf)
