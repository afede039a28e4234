"""benchmarks/common.py model_bytes on the shipped real configs (dense, MoE, hybrid, hybrid MoE
under text_config): its parameter bytes equal those of transformers' model built from the same
config (on the meta device: shapes without memory), its experts split out of them, and its KV and
recurrent-state bytes those of the config's fields; the roofline's weights per decode step."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

from benchmarks.common import model_bytes, roofline_seconds

CONFIGS = (
    "qwen3-0.6b", "qwen3-8b", "qwen3-30b-a3b", "qwen3.5-9b", "qwen3.5-27b", "qwen3.5-35b-a3b",
)  # fmt: skip


def real_config(name: str) -> dict:
    with resources.as_file(resources.files("minivllm") / "configs" / f"{name}.json") as path:
        return json.loads(path.read_text())


def hf_parameters(cfg: dict) -> dict[str, torch.Size]:
    """transformers' causal LM of the config's language model: parameter name -> shape."""
    from transformers import AutoConfig, AutoModelForCausalLM

    text = cfg.get("text_config", cfg)
    options = {k: v for k, v in text.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(text["model_type"], **options)
        )
    return {name: p.shape for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", CONFIGS)
def test_model_bytes_equal_transformers_parameters(name: str) -> None:
    cfg = real_config(name)
    text = cfg.get("text_config", cfg)
    hf = {name: shape.numel() for name, shape in hf_parameters(cfg).items()}
    sizes = model_bytes(cfg, dtype_bytes=2)
    assert sizes.weights == 2 * sum(hf.values())

    experts = sum(n for key, n in hf.items() if ".mlp.experts." in key)
    num_experts, top_k = text.get("num_experts", 0), text.get("num_experts_per_tok", 0)
    assert (experts > 0) == (num_experts > 0)
    embedding = 0 if text.get("tie_word_embeddings", False) else hf["model.embed_tokens.weight"]
    dense = sum(hf.values()) - experts - embedding
    assert sizes.dense_read == 2 * dense
    assert sizes.active == 2 * (dense + experts // max(num_experts, 1) * top_k)

    layer_types = text.get("layer_types") or ["full_attention"] * text["num_hidden_layers"]
    kv_heads, head_dim = text["num_key_value_heads"], text["head_dim"]
    assert sizes.kv_per_token == layer_types.count("full_attention") * 2 * kv_heads * head_dim * 2
    if "linear_num_key_heads" in text:
        k_dim = text["linear_num_key_heads"] * text["linear_key_head_dim"]
        v_heads, v_head_dim = text["linear_num_value_heads"], text["linear_value_head_dim"]
        conv = (text["linear_conv_kernel_dim"] - 1) * (2 * k_dim + v_heads * v_head_dim) * 2
        ssm = v_heads * text["linear_key_head_dim"] * v_head_dim * 4  # float32
        assert sizes.state_per_seq == layer_types.count("linear_attention") * (conv + ssm)
    else:
        assert sizes.state_per_seq == 0


def test_counting_inside_a_process_group_is_refused(monkeypatch) -> None:
    """There the layers would be one rank's shard: the bytes of a part of the model."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="before the engine starts"):
        model_bytes(real_config("qwen3-8b"))


def test_moe_decode_reads_top_k_experts_alone_and_all_of_them_batched() -> None:
    sizes = model_bytes(real_config("qwen3-30b-a3b"))
    assert sizes.read_per_step(1) == sizes.active
    # Qwen3-30B-A3B's model card: 3.3 B activated, with the input embedding's 0.31 B.
    assert 2 * 3.0e9 < sizes.active < 2 * 3.1e9
    everything = sizes.dense_read + sizes.num_experts * sizes.expert
    assert sizes.read_per_step(4) < sizes.read_per_step(64) < everything
    assert sizes.read_per_step(4096) == pytest.approx(everything, rel=1e-6)
    dense = model_bytes(real_config("qwen3-8b"))
    assert dense.read_per_step(1) == dense.read_per_step(256) == dense.active


def test_roofline_of_a_hybrid_moe_counts_its_states() -> None:
    """One sequence, 4 decode steps at 1 byte/s: the active weights, KV and state bytes of each
    step exactly; prefill at 1 flop/s: two flops per active weight per prompt token."""
    sizes = model_bytes(real_config("qwen3.5-35b-a3b"))
    decode = sum(
        sizes.active + (10 + step) * sizes.kv_per_token + 2 * sizes.state_per_seq
        for step in range(1, 5)
    )
    no_prefill = roofline_seconds(sizes, [10], [4], bandwidth=1.0, flops=float("inf"))
    assert no_prefill == pytest.approx(decode)
    prefill = roofline_seconds(sizes, [10], [4], bandwidth=float("inf"), flops=1.0)
    assert prefill == pytest.approx(2 * sizes.active / 2 * 10)
