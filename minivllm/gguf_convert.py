"""GGUF -> HF directory (config.json, float32 model.safetensors, tokenizer files), for tools
that do not read GGUF (transformers references, vLLM comparisons); the engine never calls it.
MTP blocks are left out; Qwen3-Next's in-projection is fused back as its checkpoints hold it."""

from __future__ import annotations

import os

import torch

from minivllm.gguf_loader import dequantized_tensors, gguf_hf_config, open_gguf
from minivllm.models.model_config import ModelConfig
from minivllm.tokenizer import load_tokenizer


def convert_gguf_to_hf(gguf_file: str, out_dir: str) -> str:
    """Writes an HF directory with the dequantized weights of `gguf_file`; returns out_dir."""
    from safetensors.torch import save_file
    from transformers import AutoConfig  # seconds to import; only this tool needs it

    reader = open_gguf(gguf_file)  # parsing the metadata takes seconds: once
    config = gguf_hf_config(reader)
    ModelConfig.from_dict(config)  # an unsupported checkpoint fails before the slow part
    tensors = {n: t for n, t in dequantized_tensors(reader) if not n.startswith("mtp.")}
    if config["architectures"] == ["Qwen3NextForCausalLM"]:
        tensors = _fused_qkvz(tensors, config)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    options = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **options)
    hf_config.dtype = "float32"
    hf_config.save_pretrained(out_dir)
    load_tokenizer(gguf_file).save_pretrained(out_dir)
    return out_dir


def _fused_qkvz(tensors: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """Each layer's in_proj_qkv and in_proj_z -> Qwen3-Next's in_proj_qkvz: for each key head,
    its q rows, k rows, then its value heads' v rows and z rows (gated_delta_weights.py)."""
    num_k, num_v = config["linear_num_key_heads"], config["linear_num_value_heads"]
    head_k, head_v = config["linear_key_head_dim"], config["linear_value_head_dim"]
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".linear_attn.in_proj_z.weight"):
            continue
        if name.endswith(".linear_attn.in_proj_qkv.weight"):
            z = tensors[name.replace("in_proj_qkv", "in_proj_z")]
            hidden = tensor.shape[-1]
            q, k, v = tensor.split([num_k * head_k, num_k * head_k, num_v * head_v])
            per_key = (head_k, head_k, num_v // num_k * head_v, num_v // num_k * head_v)
            parts = [p.reshape(num_k, rows, hidden) for p, rows in zip((q, k, v, z), per_key)]
            name, tensor = name.replace("in_proj_qkv", "in_proj_qkvz"), torch.cat(parts, 1)
            tensor = tensor.reshape(-1, hidden)
        out[name] = tensor
    return out
