"""Test helper: the hybrid families' tensors and metadata as llama.cpp's converter
(convert_hf_to_gguf.py: Qwen3NextModel, Qwen3_5TextModel, Qwen3_5MoeTextModel) writes them:
zero-centred norms as 1 + w, A_log as -exp(A_log), dt_bias renamed dt_proj.bias, the conv
weight squeezed to [C, K], Qwen3.5's value heads tiled, Qwen3-Next's in_proj_qkvz split into
q, k, v and z; the SSM sizes, full-attention interval and rotary dims in the metadata."""

from __future__ import annotations

import gguf
import numpy as np

HYBRID_GGUF_ARCHS = {
    "Qwen3_5ForCausalLM": gguf.MODEL_ARCH.QWEN35,
    "Qwen3_5MoeForCausalLM": gguf.MODEL_ARCH.QWEN35MOE,
    "Qwen3NextForCausalLM": gguf.MODEL_ARCH.QWEN3NEXT,
}


def write_hybrid_header(writer, hf: dict) -> None:
    """Qwen3NextModel.set_gguf_parameters's keys (Qwen3.5's share them)."""
    writer.add_ssm_conv_kernel(hf["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(hf["linear_key_head_dim"])
    writer.add_ssm_group_count(hf["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(hf["linear_num_value_heads"])
    writer.add_ssm_inner_size(hf["linear_value_head_dim"] * hf["linear_num_value_heads"])
    writer.add_full_attention_interval(hf.get("full_attention_interval", 4))
    factor = hf["rope_parameters"].get("partial_rotary_factor", 0.25)
    writer.add_rope_dimension_count(int(hf["head_dim"] * factor))
    if hf["architectures"][0] != "Qwen3NextForCausalLM":  # _Qwen35MRopeMixin
        sections = hf["rope_parameters"].get("mrope_section", [11, 11, 10])
        writer.add_rope_dimension_sections([*sections, 0])
    if hf.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(hf["shared_expert_intermediate_size"])


def _tiled(array: np.ndarray, dim: int, hf: dict, head_dim: int) -> np.ndarray:
    """_LinearAttentionVReorderBase._reorder_v_heads: value heads grouped -> tiled."""
    num_k = hf["linear_num_key_heads"]
    per_key = hf["linear_num_value_heads"] // num_k
    shape = array.shape
    split = array.reshape(*shape[:dim], num_k, per_key, head_dim, *shape[dim + 1 :])
    return np.swapaxes(split, dim, dim + 1).reshape(shape)


def _reorder_v_heads(name: str, array: np.ndarray, hf: dict) -> np.ndarray:
    head_v, qk_rows = (
        hf["linear_value_head_dim"],
        2 * hf["linear_num_key_heads"] * hf["linear_key_head_dim"],
    )
    if ".in_proj_qkv." in name or ".conv1d." in name:
        return np.concatenate([array[:qk_rows], _tiled(array[qk_rows:], 0, hf, head_v)])
    if ".in_proj_z." in name:
        return _tiled(array, 0, hf, head_v)
    if ".in_proj_a." in name or ".in_proj_b." in name or name.endswith((".A_log", ".dt_bias")):
        return _tiled(array, 0, hf, 1)
    if ".out_proj." in name:
        return _tiled(array, 1, hf, head_v)
    return array


def _split_qkvz(array: np.ndarray, hf: dict) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3NextModel.modify_tensors: [q, k, v, z] per key head -> every q, k, v; every z."""
    head_k, head_v = hf["linear_key_head_dim"], hf["linear_value_head_dim"]
    num_k = hf["linear_num_key_heads"]
    per_key = hf["linear_num_value_heads"] // num_k
    sizes = [head_k, head_k, per_key * head_v, per_key * head_v]
    hidden = array.shape[1]
    parts = np.split(array.T.reshape(hidden, num_k, sum(sizes)), np.cumsum(sizes)[:-1], axis=-1)
    q, k, v, z = (p.reshape(hidden, -1) for p in parts)
    return np.concatenate([q, k, v], axis=-1).T.copy(), z.T.copy()


def llama_cpp_hybrid_arrays(hf: dict, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF name -> array, as the converter changes them, under names gguf's name map knows."""
    arch = HYBRID_GGUF_ARCHS[hf["architectures"][0]]
    tiled = arch != gguf.MODEL_ARCH.QWEN3NEXT
    out = {}
    for name, array in arrays.items():
        if tiled and "linear_attn." in name:
            array = _reorder_v_heads(name, array, hf)
        if name.endswith(".A_log"):
            array = -np.exp(array)
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif ".conv1d." in name:
            array = array.squeeze(1)
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            array = array + 1
        if name.endswith("in_proj_qkvz.weight"):
            prefix = name.removesuffix("in_proj_qkvz.weight")
            out[prefix + "in_proj_qkv.weight"], out[prefix + "in_proj_z.weight"] = _split_qkvz(
                array, hf
            )
            continue
        out[name] = array
    return out


def mtp_blocks(arrays: dict[str, np.ndarray], num_layers: int) -> dict[str, np.ndarray]:
    """Stand-ins for the MTP layer llama.cpp appends as block num_layers (the last layer's
    tensors under its index; the loader must leave them out)."""
    last, mtp = f"model.layers.{num_layers - 1}.", f"model.layers.{num_layers}."
    return {mtp + n.removeprefix(last): a + 1 for n, a in arrays.items() if n.startswith(last)}
