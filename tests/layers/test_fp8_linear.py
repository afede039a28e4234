"""The block-FP8 linear method: quantization configs parsed or refused by name, FP8 weights
and their block scales loaded through packed and tensor-parallel layers, bad scale shapes and
unquantized tensors refused with the parameter's name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.config import EngineConfig
from minivllm.layers import linear as linear_module
from minivllm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from minivllm.layers.ops import LayerOps
from minivllm.layers.quantization.build import quantized_ops
from minivllm.layers.quantization.config import (
    QuantConfig,
    quant_config_from_hf,
    resolve_quantization,
)
from minivllm.layers.quantization.fp8_math import dequantize_token_groups, quantize_token_groups
from minivllm.model_loader import build_model, load_dummy_weights
from minivllm.models.model_config import ModelConfig
from minivllm.tiny_model import build_tiny_model
from tests.fp8_checkpoint import (
    COMPRESSED_TENSORS_FP8,
    FP8_SIZES,
    QWEN_FP8,
    block_dequantize,
    block_quantize,
    edit_config,
    write_fp8_checkpoints,
)

FP8_OPS = quantized_ops(LayerOps(), QuantConfig("fp8"))


@pytest.mark.parametrize("method", ["awq", "gptq", "mxfp4", "bitsandbytes", None])
def test_other_quant_methods_are_refused_by_name(method) -> None:
    with pytest.raises(ValueError, match=f"quant_method {method!r} is not supported"):
        quant_config_from_hf({"quantization_config": {"quant_method": method, "bits": 4}})


def test_fp8_configs_parse_and_bad_ones_name_the_field() -> None:
    assert quant_config_from_hf({}) is None
    assert quant_config_from_hf({"quantization_config": QWEN_FP8}) == QuantConfig("fp8")
    ct = quant_config_from_hf({"quantization_config": COMPRESSED_TENSORS_FP8})
    assert ct == QuantConfig("compressed-tensors", "weight_scale", ("lm_head",))
    with pytest.raises(ValueError, match=r"weight_block_size \[64, 64\]"):
        quant_config_from_hf({"quantization_config": {**QWEN_FP8, "weight_block_size": [64, 64]}})
    with pytest.raises(ValueError, match="no weight_block_size.*per-tensor"):
        quant_config_from_hf({"quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(ValueError, match="activation_scheme 'static'"):
        quant_config_from_hf({"quantization_config": {**QWEN_FP8, "activation_scheme": "static"}})
    group = COMPRESSED_TENSORS_FP8["config_groups"]["group_0"]
    channel = {**group, "weights": {**group["weights"], "strategy": "channel"}}
    bad = {**COMPRESSED_TENSORS_FP8, "config_groups": {"group_0": channel}}
    with pytest.raises(ValueError, match="strategy 'block'"):
        quant_config_from_hf({"quantization_config": bad})


def test_quantization_option_resolves_against_the_checkpoint() -> None:
    assert resolve_quantization(None, None) is None
    assert resolve_quantization("fp8", None) == QuantConfig("fp8", quantize_at_load=True)
    assert resolve_quantization("fp8", QuantConfig("fp8")) == QuantConfig("fp8")
    with pytest.raises(ValueError, match="'awq'"):
        resolve_quantization("awq", None)


def shard_weights(monkeypatch, rank: int, tp_size: int, make):
    monkeypatch.setattr(linear_module, "get_tp_rank_size", lambda: (rank, tp_size))
    return make()


def w8a8(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The FP8 path's product: x rounded per token-group of 128, times the dequantized weight."""
    return F.linear(dequantize_token_groups(*quantize_token_groups(x)), weight)


def load_parts(layer, parts: dict, shard_ids) -> None:
    for shard_id, (q, s) in zip(shard_ids, parts, strict=True):
        layer.weight.weight_loader(layer.weight, q, shard_id)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, shard_id)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_packed_and_parallel_fp8_layers_match_the_dequantized_weights(monkeypatch, tp_size):
    """q/k/v and gate/up packed, sliced per rank by rows, down_proj by columns: every rank
    computes its slice of the dequantized weights' W8A8 product."""
    hidden, head_dim, heads, kv_heads, inter = 256, 128, 4, 2, 256
    torch.manual_seed(0)
    ckpt = {
        "q": torch.randn(heads * head_dim, hidden), "k": torch.randn(kv_heads * head_dim, hidden),
        "v": torch.randn(kv_heads * head_dim, hidden), "gate": torch.randn(inter, hidden),
        "up": torch.randn(inter, hidden), "down": torch.randn(hidden, inter),
    }  # fmt: skip
    quant = {name: block_quantize(w) for name, w in ckpt.items()}
    deq = {name: block_dequantize(*qs) for name, qs in quant.items()}
    x, h = torch.randn(3, hidden), torch.randn(3, inter)
    down_sum = 0
    for rank in range(tp_size):

        def on_rank(make, rank=rank):
            return shard_weights(monkeypatch, rank, tp_size, make)

        qkv = on_rank(lambda: QKVParallelLinear(hidden, head_dim, heads, kv_heads, ops=FP8_OPS))
        gate_up = on_rank(lambda: MergedColumnParallelLinear(hidden, [inter] * 2, ops=FP8_OPS))
        down = on_rank(lambda: RowParallelLinear(inter, hidden, ops=FP8_OPS))
        load_parts(qkv, [quant[n] for n in "qkv"], "qkv")
        load_parts(gate_up, [quant["gate"], quant["up"]], (0, 1))
        load_parts(down, [quant["down"]], (None,))
        q_rows = slice(rank * qkv.q_size, (rank + 1) * qkv.q_size)
        kv_rows = slice(rank * qkv.kv_size, (rank + 1) * qkv.kv_size)
        expected = [deq["q"][q_rows], deq["k"][kv_rows], deq["v"][kv_rows]]
        torch.testing.assert_close(qkv(x), w8a8(x, torch.cat(expected)), atol=1e-4, rtol=1e-5)
        part = slice(rank * inter // tp_size, (rank + 1) * inter // tp_size)
        expected = torch.cat([deq["gate"][part], deq["up"][part]])
        torch.testing.assert_close(gate_up(x), w8a8(x, expected), atol=1e-4, rtol=1e-5)
        down_sum = down_sum + down.linear(h[:, part], None)  # the all-reduce's parts
    # Each rank rounds its own slice of h: 128-wide groups either way, the same groups.
    torch.testing.assert_close(down_sum, w8a8(h, deq["down"]), atol=1e-4, rtol=1e-5)


def test_slices_off_the_fp8_blocks_are_refused(monkeypatch) -> None:
    """Under TP=2 a 128-row KV projection gives each rank 64 rows: half a block."""
    layer = shard_weights(monkeypatch, 0, 2, lambda: QKVParallelLinear(128, 64, 4, 2, ops=FP8_OPS))
    q, s = block_quantize(torch.randn(128, 128))
    with pytest.raises(ValueError, match="does not fall on FP8 blocks of 128"):
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, "k")


def test_replicated_fp8_layer_rejects_a_bad_scale_shape() -> None:
    layer = ReplicatedLinear(256, 200, ops=FP8_OPS)
    assert layer.weight_scale_inv.shape == (2, 2)
    with pytest.raises(ValueError, match=r"\(2, 1\).*\(2, 2\)"):
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, torch.ones(2, 1))


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("fp8-errors")
    src = build_tiny_model(str(root / "src"), "Qwen3ForCausalLM", **FP8_SIZES)
    write_fp8_checkpoints(src, str(root / "fp8"), str(root / "ref"), QWEN_FP8)
    return str(root / "fp8")


def load(model_dir: str):
    config = ModelConfig.from_hf(model_dir)
    return build_model(
        config, TorchSDPABackend(), torch.float32, "cpu", model_dir, quant=config.quantization
    )


def rewrite(fp8_dir: str, out_dir, change) -> str:
    import shutil

    shutil.copytree(fp8_dir, out_dir)
    path = f"{out_dir}/model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)
    return str(out_dir)


def test_bad_scale_shape_in_a_checkpoint_names_the_tensor(fp8_dir, tmp_path) -> None:
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"

    def change(t):
        t[name] = torch.ones(2, 3)

    with pytest.raises(ValueError, match=f"cannot load '{name}'.*shape mismatch"):
        load(rewrite(fp8_dir, tmp_path / "bad", change))


def test_missing_scales_and_unquantized_weights_are_named(fp8_dir, tmp_path) -> None:
    name = "model.layers.0.self_attn.o_proj.weight"

    def drop_scale(t):
        del t[name + "_scale_inv"]

    with pytest.raises(ValueError, match=f"missing.*{name}_scale_inv"):
        load(rewrite(fp8_dir, tmp_path / "noscale", drop_scale))

    def unquantize(t):
        t[name] = t[name].float()

    with pytest.raises(ValueError, match=f"cannot load '{name}'.*float32.*float8_e4m3fn"):
        load(rewrite(fp8_dir, tmp_path / "f32", unquantize))


def test_ignore_list_naming_a_projection_is_refused(fp8_dir, tmp_path) -> None:
    out = rewrite(fp8_dir, tmp_path / "ignored", lambda t: None)
    edit_config(out, quantization_config={**QWEN_FP8, "modules_to_not_convert": ["lm_head"]})
    load(out)  # the LM head is never quantized
    edit_config(out, quantization_config={
        **QWEN_FP8, "modules_to_not_convert": ["model.layers.1.self_attn.k_proj"]})  # fmt: skip
    with pytest.raises(ValueError, match="'model.layers.1.self_attn.k_proj'"):
        load(out)


def test_fp8_experts_off_the_blocks_are_a_clear_error(tiny_qwen3_moe_dir) -> None:
    config = ModelConfig.from_hf(tiny_qwen3_moe_dir)  # moe_intermediate_size 32
    with pytest.raises(ValueError, match=r"moe_intermediate_size \(32\).*multiple of 128"):
        build_model(config, TorchSDPABackend(), torch.float32, "cpu", load_format="dummy",
                    quant=QuantConfig("fp8", quantize_at_load=True))  # fmt: skip


def test_dummy_fp8_weights_dequantize_to_the_dummy_spread() -> None:
    layer = ReplicatedLinear(256, 256, ops=FP8_OPS)
    load_dummy_weights(layer, seed=0)
    weight = block_dequantize(layer.weight, layer.weight_scale_inv)
    assert torch.all(layer.weight_scale_inv == 0.02)
    assert 0.018 < float(weight.std()) < 0.022


def test_engine_option_quantization_is_checked(tiny_qwen3_dir: str) -> None:
    assert EngineConfig(model=tiny_qwen3_dir, quantization="fp8").quantization == "fp8"
    with pytest.raises(ValueError, match="quantization must be fp8 or None.*'awq'"):
        EngineConfig(model=tiny_qwen3_dir, quantization="awq")
