"""A tiny Qwen3-Next in Qwen's block-FP8 layout (its fused in_proj_qkvz quantized whole, in_proj_ba
left in float and on the ignore list, as Qwen's checkpoints are): the block scales split with
their rows, so each split projection dequantizes to the split of the dequantized fused one, and
the model's logits are the W8A8 product of the dequantized weights; a split inside a 128-row
block, or a scale of the wrong shape, is a ValueError naming the tensor."""

from __future__ import annotations

import os
import re

import pytest
import torch
from safetensors.torch import load_file

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.layers.gated_delta_weights import split_ba, split_in_proj, split_qkvz
from minivllm.layers.ops import LayerOps
from minivllm.layers.quantization.fp8_math import dequantize_blocks
from minivllm.model_loader import build_model
from minivllm.models.model_config import ModelConfig
from minivllm.tiny_model import build_tiny_model
from tests.fp8_checkpoint import (
    FP8_NEXT_SIZES,
    QWEN_NEXT_FP8,
    w8a8_emulation,
    write_fp8_checkpoints,
)
from tests.helpers import hybrid_prefill_logits


@pytest.fixture(scope="module")
def fp8_next_dirs(tmp_path_factory) -> tuple[str, str]:
    """(the block-FP8 checkpoint, the same weights dequantized to float32)."""
    root = tmp_path_factory.mktemp("fp8-next")
    src = build_tiny_model(str(root / "src"), "Qwen3NextForCausalLM", **FP8_NEXT_SIZES)
    write_fp8_checkpoints(src, str(root / "fp8"), str(root / "ref"), QWEN_NEXT_FP8)
    return str(root / "fp8"), str(root / "ref")


def load(model_dir: str, ops: LayerOps | None = None):
    config = ModelConfig.from_hf(model_dir)
    return build_model(
        config, TorchSDPABackend(), torch.float32, "cpu", model_dir,
        ops=ops or LayerOps(), quant=config.quantization,
    )  # fmt: skip


def test_split_projections_dequantize_to_the_split_of_the_fused_ones(fp8_next_dirs) -> None:
    fp8_dir, ref_dir = fp8_next_dirs
    gdn = load(fp8_dir).model.layers[0].linear_attn
    ref = load_file(os.path.join(ref_dir, "model.safetensors"))
    prefix = "model.layers.0.linear_attn."
    qkv, z = split_qkvz(ref[prefix + "in_proj_qkvz.weight"], 2, 6, 128, 128)
    for layer, weight in ((gdn.in_proj_qkv, qkv), (gdn.in_proj_z, z)):
        assert layer.weight.dtype == torch.float8_e4m3fn
        dequantized = dequantize_blocks(layer.weight, layer.weight_scale_inv)
        torch.testing.assert_close(dequantized, weight, rtol=0, atol=0)
    assert gdn.in_proj_qkv.weight_scale_inv.shape == (10, 1)
    b, a = split_ba(ref[prefix + "in_proj_ba.weight"], 2, 6)
    assert torch.equal(gdn.in_proj_b.weight, b) and torch.equal(gdn.in_proj_a.weight, a)


def test_logits_are_w8a8_of_the_dequantized_weights(fp8_next_dirs) -> None:
    fp8_dir, ref_dir = fp8_next_dirs
    model = load(fp8_dir)
    config = model.config
    # The layers left unquantized, told by their rows: LM head, router, shared-expert gate,
    # in_proj_b and in_proj_a (no FP8 weight, nor an expert's gate_up or down, has as many).
    linear = config.linear_attention
    unquantized = (model.lm_head.weight.shape[0], config.moe.num_experts, 1, linear.num_v_heads)
    fp8_rows = {p.shape[-2] for p in model.parameters() if p.dtype == torch.float8_e4m3fn}
    assert not fp8_rows & set(unquantized)
    emulated = load(ref_dir, LayerOps(gemm=w8a8_emulation(*unquantized)))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in (9, 30)]
    for ours, theirs in zip(
        hybrid_prefill_logits(model, prompts), hybrid_prefill_logits(emulated, prompts), strict=True
    ):
        torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_block_scales_split_with_their_rows() -> None:
    """in_proj_ba's 12 rows (b, a of two key heads) are one block: b and a both take its
    scales; in_proj_qkvz's, 128-dim heads, take the blocks their rows came from."""
    name = "model.layers.0.linear_attn.in_proj_ba.weight_scale_inv"
    scale = torch.tensor([[2.0, 3.0]])
    split = dict(split_in_proj(name, scale, 2, 6, 128, 128))
    assert split.keys() == {name.replace("_ba.", "_b."), name.replace("_ba.", "_a.")}
    assert all(torch.equal(s, scale) for s in split.values())
    qkvz = torch.arange(16.0)[:, None]  # 2048 rows: 16 blocks, per key head q k v v v z z z
    split = dict(split_in_proj(name.replace("_ba.", "_qkvz."), qkvz, 2, 6, 128, 128))
    qkv, z = split.values()
    assert qkv.flatten().tolist() == [0, 8, 1, 9, 2, 3, 4, 10, 11, 12]
    assert z.flatten().tolist() == [5, 6, 7, 13, 14, 15]


def test_a_split_inside_a_block_is_a_clear_error() -> None:
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight_scale_inv"
    # 16-dim heads: 192 rows (two blocks); key head 1's q rows start at row 96, in block 0.
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}: splitting it falls inside"):
        split_in_proj(name, torch.ones(2, 1), 2, 4, 16, 16)
    with pytest.raises(ValueError, match=rf"^{re.escape(name)} has shape \(3, 1\)"):
        split_in_proj(name, torch.ones(3, 1), 2, 4, 16, 16)
