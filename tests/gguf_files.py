"""Test helper: GGUF files written from the tiny random HF checkpoints as llama.cpp's converter
writes them (names from the `gguf` package's own HF -> GGUF map, Llama's q/k rows permuted, a
MoE layer's experts stacked, the hybrid families' changes of tests/gguf_hybrid_files.py), every
tensor of two or more dims in one GGML type, and the values
such a file holds (what the loader should dequantize) under their HF names."""

from __future__ import annotations

import json
import math
import os
import re

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

from tests.gguf_hybrid_files import (
    HYBRID_GGUF_ARCHS,
    llama_cpp_hybrid_arrays,
    mtp_blocks,
    write_hybrid_header,
)

GGUF_ARCHS = {
    "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3,
    "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2,
    "LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA,
    "Qwen3MoeForCausalLM": gguf.MODEL_ARCH.QWEN3MOE,
    **HYBRID_GGUF_ARCHS,
}
_EXPERT = re.compile(r"(?P<prefix>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<part>\w+)\.weight")


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotary halves -> interleaved pairs."""
    shape = weight.shape
    split = weight.reshape(num_heads, 2, shape[0] // num_heads // 2, *shape[1:])
    return split.swapaxes(1, 2).reshape(shape)


def llama_cpp_rope_factors(head_dim: int, base: float, rope: dict) -> np.ndarray:
    """convert_hf_to_gguf.py's Llama 3 rope_freqs tensor: each frequency's divisor."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old_context_len / high:
            factors.append(1.0)
        elif wavelen > old_context_len / low:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_header(writer, hf: dict) -> None:
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    if "intermediate_size" in hf:  # Qwen3.5-MoE has no dense MLP
        writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_head_count_kv(hf["num_key_value_heads"])
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    writer.add_rope_freq_base(hf.get("rope_parameters", {}).get("rope_theta", 10000.0))
    writer.add_vocab_size(hf["vocab_size"])
    writer.add_eos_token_id(hf["eos_token_id"])
    num_experts = hf.get("num_experts", hf.get("num_local_experts"))  # transformers 5's name
    if num_experts:  # convert_hf_to_gguf.py's Qwen3MoeModel
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(hf["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(hf["moe_intermediate_size"])
    if (hf.get("architectures") or [None])[0] in HYBRID_GGUF_ARCHS:
        write_hybrid_header(writer, hf)


def write_tokenizer(writer, hf_dir: str) -> None:
    """The tiny byte-level BPE of hf_dir as GGUF tokenizer metadata (llama.cpp's `gpt2` model and
    pre-tokenizer: GPT-2's split, as the tiny tokenizer's), which transformers reads back into the
    same tokenizer."""
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        spec = json.load(f)
    special = {t["content"]: t["id"] for t in spec["added_tokens"]}
    ids = {**spec["model"]["vocab"], **special}
    tokens = sorted(ids, key=ids.__getitem__)  # GGUF's list is indexed by id: no gaps
    assert [ids[t] for t in tokens] == list(range(len(tokens)))
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(pair) for pair in spec["model"]["merges"]])
    with open(os.path.join(hf_dir, "chat_template.jinja")) as f:
        writer.add_chat_template(f.read())


def stored_type(
    array: np.ndarray, qtype: gguf.GGMLQuantizationType, name: str = ""
) -> gguf.GGMLQuantizationType:
    """qtype for a matrix (or expert stack) whose rows are whole blocks of it, else F32 (norms,
    and the causal conv's weight, as llama.cpp keeps them)."""
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    whole_blocks = array.ndim > 1 and array.shape[-1] % block == 0
    return qtype if whole_blocks and "conv1d" not in name else gguf.GGMLQuantizationType.F32


def stored_values(
    tensor: torch.Tensor, qtype: gguf.GGMLQuantizationType, name: str = ""
) -> torch.Tensor:
    """The float32 values a file of qtype holds for tensor (HF name: name): quantized, then
    dequantized."""
    array = tensor.float().numpy()
    kind = stored_type(array, qtype, name)
    values = gguf.quants.dequantize(gguf.quants.quantize(array, kind), kind)
    return torch.from_numpy(np.array(values, dtype=np.float32))


def _gguf_arrays(
    hf: dict, tensors: dict[str, torch.Tensor], fuse_gate_up: bool = False
) -> dict[str, np.ndarray]:
    """HF name -> float32 array in llama.cpp's layout (Llama's q/k permuted; each layer's
    experts stacked [E, ...] under HF's fused name, `<prefix>.experts.gate_proj.weight`)."""
    arch = GGUF_ARCHS[hf["architectures"][0]]
    arrays: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, tensor in tensors.items():
        array = tensor.float().numpy()
        match = _EXPERT.fullmatch(name)
        if match is not None:
            key = f"{match['prefix']}.{match['part']}.weight"
            experts.setdefault(key, {})[int(match["expert"])] = array
            continue
        if arch == gguf.MODEL_ARCH.LLAMA and ".q_proj." in name:
            array = llama_cpp_permute(array, hf["num_attention_heads"])
        elif arch == gguf.MODEL_ARCH.LLAMA and ".k_proj." in name:
            array = llama_cpp_permute(array, hf["num_key_value_heads"])
        arrays[name] = array
    if arch in HYBRID_GGUF_ARCHS.values():
        arrays = llama_cpp_hybrid_arrays(hf, arrays)
    for key, stack in experts.items():
        arrays[key] = np.stack([stack[e] for e in range(len(stack))])
    if fuse_gate_up:  # convert_hf_to_gguf.py --fuse-gate-up-exps: gate rows, then up rows
        for key in [k for k in arrays if k.endswith(".experts.gate_proj.weight")]:
            up = arrays.pop(key.replace("gate_proj", "up_proj"))
            gate_up = np.concatenate([arrays.pop(key), up], axis=1)
            arrays[key.replace("gate_proj", "gate_up_proj")] = gate_up
    return arrays


def write_gguf(
    hf_dir: str,
    path: str,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    mtp_layers: int = 0,
    fuse_gate_up: bool = False,
) -> str:
    """The checkpoint (and tokenizer) in hf_dir as a GGUF file at path, its matrices in qtype;
    mtp_layers: 1 to append a stand-in MTP block as llama.cpp does (nextn_predict_layers);
    fuse_gate_up: experts' gate and up stacked in one tensor (`ffn_gate_up_exps`)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        hf = json.load(f)
    arch = GGUF_ARCHS[hf["architectures"][0]]
    names = gguf.get_tensor_name_map(arch, hf["num_hidden_layers"] + mtp_layers)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    write_header(writer, {**hf, "num_hidden_layers": hf["num_hidden_layers"] + mtp_layers})
    if mtp_layers:
        writer.add_nextn_predict_layers(mtp_layers)
    write_tokenizer(writer, hf_dir)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    arrays = _gguf_arrays(hf, tensors, fuse_gate_up)
    if mtp_layers:
        arrays.update(mtp_blocks(arrays, hf["num_hidden_layers"]))
    for name, array in arrays.items():
        kind = stored_type(array, qtype, name)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        writer.add_tensor(gguf_name, gguf.quants.quantize(array, kind), raw_dtype=kind)
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type") == "llama3":
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        factors = llama_cpp_rope_factors(head_dim, rope["rope_theta"], rope)
        writer.add_tensor("rope_freqs.weight", factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
