"""Test helper: a tiny checkpoint rewritten in the block-FP8 layouts that minivllm loads (Qwen's
`fp8` with `weight_scale_inv`, compressed-tensors' block FP8 with `weight_scale`), and the same
weights dequantized to float32. Its own block quantizer, written from the format's definition,
so that the loader is checked against an independent writer."""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from minivllm.layers.quantization.fp8_math import dequantize_token_groups, quantize_token_groups

LINEAR_NAMES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    # Qwen3-Next's Gated DeltaNet: its fused in_proj_qkvz quantized whole; in_proj_ba left
    # unquantized, as Qwen's FP8 checkpoints leave it
    "in_proj_qkvz", "out_proj",
)  # fmt: skip
# A tiny Qwen3 whose packed shards fall on 128-row blocks (q, k, v 256 rows; gate, up 384).
FP8_SIZES = dict(
    hidden_size=128, head_dim=128, num_attention_heads=2, num_key_value_heads=2,
    intermediate_size=384,
)  # fmt: skip

# Qwen3-MoE: each expert's gate, up and down 128 x 128 (one block), 8 experts, top-2.
FP8_MOE_SIZES = {**FP8_SIZES, "moe_intermediate_size": 128}
# Qwen3-Next: two key heads of three 128-dim value heads, so in_proj_qkvz [2048, 128]
# interleaves q, k (one block each), v and z (three blocks each) per key head.
FP8_NEXT_SIZES = dict(
    **FP8_MOE_SIZES, shared_expert_intermediate_size=128, linear_num_key_heads=2,
    linear_num_value_heads=6, linear_key_head_dim=128, linear_value_head_dim=128,
)  # fmt: skip

QWEN_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# Qwen's Qwen3-Next / Qwen3.5 FP8: in_proj_ba (b, a) and the routers left in bf16.
QWEN_NEXT_FP8 = {
    **QWEN_FP8,
    "modules_to_not_convert": [
        "lm_head", "linear_attn.in_proj_ba", "mlp.gate", "mlp.shared_expert_gate",
    ],
}  # fmt: skip
COMPRESSED_TENSORS_FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"type": "float", "num_bits": 8, "strategy": "block",
                        "block_structure": [128, 128], "symmetric": True, "dynamic": False},
            "input_activations": {"type": "float", "num_bits": 8, "strategy": "group",
                                  "group_size": 128, "symmetric": True, "dynamic": True},
        }
    },
}  # fmt: skip


def block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], float32 [ceil(N/128), ceil(K/128)]): each 128 x 128 block
    divided by amax / 448."""
    n, k = w.shape
    rows, cols = -(-n // 128), -(-k // 128)
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    scale = torch.empty(rows, cols)
    for i in range(rows):
        for j in range(cols):
            block = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].float()
            scale[i, j] = block.abs().max().clamp_min(1e-10) / 448.0
            q[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = (block / scale[i, j]).to(q.dtype)
    return q, scale


def block_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    full = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return q.float() * full


def is_linear_weight(name: str) -> bool:
    return name.endswith(".weight") and any(f".{p}." in name for p in LINEAR_NAMES)


def write_fp8_checkpoints(src_dir: str, fp8_dir: str, ref_dir: str, layout: dict) -> None:
    """fp8_dir: src_dir's linear weights in block FP8 (scales named as `layout` says) and its
    config.json with `layout` as quantization_config; ref_dir: the same weights dequantized."""
    tensors = load_file(os.path.join(src_dir, "model.safetensors"))
    scale_suffix = "_scale_inv" if layout["quant_method"] == "fp8" else "_scale"
    fp8, ref = {}, {}
    for name, tensor in tensors.items():
        if is_linear_weight(name):
            q, s = block_quantize(tensor)
            fp8[name], fp8[name + scale_suffix] = q, s
            ref[name] = block_dequantize(q, s)
        else:
            fp8[name] = ref[name] = tensor
    for out_dir, weights in ((fp8_dir, fp8), (ref_dir, ref)):
        shutil.copytree(src_dir, out_dir, dirs_exist_ok=True)
        save_file(weights, os.path.join(out_dir, "model.safetensors"))
    edit_config(fp8_dir, quantization_config=layout)


def edit_config(model_dir: str, **changes) -> None:
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)


def w8a8_emulation(*unquantized_rows: int):
    """A GEMM that quantizes its input per token-group as the FP8 path does (not the LM
    head's or a router's, told by their rows: the padded vocabulary, the experts): on
    dequantized weights it computes what the FP8 model should, to float32."""

    def gemm(x, weight, bias=None):
        if weight.shape[0] not in unquantized_rows:
            x = dequantize_token_groups(*quantize_token_groups(x))
        return F.linear(x, weight, bias)

    return gemm
