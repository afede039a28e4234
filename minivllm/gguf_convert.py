"""GGUF -> HF directory (config.json, float32 model.safetensors, tokenizer files), for tools
that do not read GGUF (transformers references, vLLM comparisons); the engine never calls it."""

from __future__ import annotations

import os

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
    tensors = dict(dequantized_tensors(reader))
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    options = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **options)
    hf_config.dtype = "float32"
    hf_config.save_pretrained(out_dir)
    load_tokenizer(gguf_file).save_pretrained(out_dir)
    return out_dir
