"""GGUF files of the hybrid families (llama.cpp's `qwen35`, `qwen35moe`, `qwen3next`): their
metadata as the HF config's Gated DeltaNet fields, and their tensors back in HF's names and
values. llama.cpp's converter (convert_hf_to_gguf.py) changes these tensors, and each change
is undone here, so that the loaded weights are the checkpoint's:

- every zero-centred RMSNorm (input / post-attention / final norm, attention q/k norms; not the
  Gated DeltaNet's output norm) is stored as 1 + w;
- A_log is stored as -exp(A_log) (`ssm_a`), dt_bias as `ssm_dt.bias`;
- the causal conv's weight [C, 1, K] is stored as [C, K];
- Qwen3.5's value heads (qwen35, qwen35moe, where there are more value than key heads) are
  reordered from grouped by key head (g * r + j) to tiled (j * H_k + g) in the v rows of
  in_proj_qkv and conv1d, in_proj_z, in_proj_a / in_proj_b, A_log, dt_bias and out_proj's
  columns;
- Qwen3-Next's in_proj_qkvz is split into q, k, v (`attn_qkv`) and z (`attn_gate`) in
  Qwen3.5's order; its in_proj_ba (`ssm_ba`) is kept, and split as a safetensors checkpoint's;
- MTP layers are appended as blocks after the decoder's (`nextn_predict_layers`); they are
  named under `mtp.` here, which the models do not load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# GGUF general.architecture -> our (HF) architecture name, and transformers' model_type.
HYBRID_ARCHITECTURES = {
    "qwen35": ("Qwen3_5ForCausalLM", "qwen3_5_text"),
    "qwen35moe": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
    "qwen3next": ("Qwen3NextForCausalLM", "qwen3_next"),
}
# The architectures whose config transformers' GGUF reader does not know, which AutoTokenizer
# reads first: their tokenizer is built from the file's vocabulary alone (tokenizer.py).
VOCABULARY_ONLY_TOKENIZERS = ("qwen3next",)
# The architectures whose value heads llama.cpp stores tiled.
_TILED_V_HEADS = ("qwen35", "qwen35moe")
# llama.cpp's layer tensor name -> HF's (under model.layers.N.).
HYBRID_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_in": "linear_attn.in_proj_qkvz",  # Qwen3-Next files from before the split
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_ba": "linear_attn.in_proj_ba",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# llama.cpp's names of the per-head parameters, which HF names without a leaf.
_PER_HEAD = {"blk.{}.ssm_a": "A_log", "blk.{}.ssm_dt.bias": "dt_bias"}
# {arch}.<key> -> the HF config's field.
_SSM_KEYS = {
    "linear_conv_kernel_dim": "ssm.conv_kernel",
    "linear_key_head_dim": "ssm.state_size",
    "linear_num_key_heads": "ssm.group_count",
    "linear_num_value_heads": "ssm.time_step_rank",
}


@dataclass(frozen=True)
class HybridLayout:
    """What undoing llama.cpp's changes needs: the decoder's layer count and GDN head sizes."""

    num_layers: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    tiled_v_heads: bool


def gguf_hybrid_fields(field: Callable[[str, Any], Any], arch: str, head_dim: int) -> dict:
    """The HF config's hybrid fields; field(key, default) reads `{arch}.<key>` metadata. A
    missing key is a ValueError naming it."""

    def required(key: str) -> int:
        value = field(key, None)
        if value is None:
            raise ValueError(f"the GGUF file has no {arch + '.' + key!r} metadata")
        return int(value)

    fields = {name: required(key) for name, key in _SSM_KEYS.items()}
    inner = required("ssm.inner_size")
    if inner % fields["linear_num_value_heads"]:
        raise ValueError(
            f"the GGUF's {arch}.ssm.inner_size ({inner}) is not a multiple of "
            f"{arch}.ssm.time_step_rank ({fields['linear_num_value_heads']})"
        )
    rope_dim = required("rope.dimension_count")
    return {
        **fields,
        "linear_value_head_dim": inner // fields["linear_num_value_heads"],
        "num_hidden_layers": required("block_count") - int(field("nextn_predict_layers", 0)),
        "full_attention_interval": int(field("full_attention_interval", 4)),
        "partial_rotary_factor": rope_dim / head_dim,
    }


def hybrid_layout(config: dict[str, Any], arch: str) -> HybridLayout:
    """The layout of a file whose HF config (gguf_hybrid_fields in it) is `config`."""
    return HybridLayout(
        num_layers=config["num_hidden_layers"],
        num_k_heads=config["linear_num_key_heads"],
        num_v_heads=config["linear_num_value_heads"],
        head_k_dim=config["linear_key_head_dim"],
        head_v_dim=config["linear_value_head_dim"],
        tiled_v_heads=arch in _TILED_V_HEADS,
    )


def hybrid_tensor(
    layout: HybridLayout, gguf_name: str, hf_name: str, weight: torch.Tensor
) -> tuple[str, torch.Tensor]:
    """A tensor of a hybrid file (hf_name: gguf_loader's renaming) -> HF's (name, values)."""
    parts = gguf_name.split(".")
    if parts[0] != "blk":
        return hf_name, _unshift_norm(hf_name, weight)
    layer = int(parts[1])
    if layer >= layout.num_layers:  # an MTP block
        return f"mtp.{gguf_name}", weight
    for pattern, param in _PER_HEAD.items():
        if gguf_name == pattern.format(layer):
            hf_name = f"model.layers.{layer}.linear_attn.{param}"
            weight = torch.log(-weight) if param == "A_log" else weight
    if hf_name.endswith("linear_attn.conv1d.weight") and weight.dim() == 2:
        weight = weight.unsqueeze(1)
    if hf_name.endswith("mlp.shared_expert_gate.weight"):
        weight = weight.reshape(1, -1)
    if layout.tiled_v_heads and layout.num_v_heads != layout.num_k_heads:
        weight = _untile_v_heads(layout, hf_name, weight)
    return hf_name, _unshift_norm(hf_name, weight)


def _unshift_norm(hf_name: str, weight: torch.Tensor) -> torch.Tensor:
    """w from llama.cpp's 1 + w, for the zero-centred norms (all but the GDN's output norm)."""
    if hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        return weight - 1
    return weight


def _untile_v_heads(layout: HybridLayout, hf_name: str, weight: torch.Tensor) -> torch.Tensor:
    """Value heads back from llama.cpp's tiled order to HF's grouped order, on the dimension
    (and rows) each tensor holds them."""
    leaf = hf_name.rsplit(".linear_attn.", 1)[-1] if ".linear_attn." in hf_name else ""
    head_v = layout.head_v_dim
    if leaf in ("in_proj_qkv.weight", "conv1d.weight"):
        qk_rows = 2 * layout.num_k_heads * layout.head_k_dim
        v = _grouped(layout, weight[qk_rows:], 0, head_v)
        return torch.cat([weight[:qk_rows], v])
    if leaf == "in_proj_z.weight":
        return _grouped(layout, weight, 0, head_v)
    if leaf in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
        return _grouped(layout, weight, 0, 1)
    if leaf == "out_proj.weight":
        return _grouped(layout, weight, 1, head_v)
    return weight


def _grouped(layout: HybridLayout, weight: torch.Tensor, dim: int, head_dim: int) -> torch.Tensor:
    """Dimension dim, [r, H_k, head_dim] (tiled) -> [H_k, r, head_dim] (grouped)."""
    per_key = layout.num_v_heads // layout.num_k_heads
    shape = weight.shape
    split = weight.reshape(*shape[:dim], per_key, layout.num_k_heads, head_dim, *shape[dim + 1 :])
    return split.transpose(dim, dim + 1).reshape(shape)
