"""GGUF checkpoints (llama.cpp's one-file format): their metadata as an HF config dict, and
their weights. The `gguf` package (optional) reads the file and dequantizes each tensor to
float32; tensors are renamed to HF names (Llama's q/k rows un-permuted; the hybrid families'
changes undone in gguf_hybrid.py) and then loaded like a safetensors checkpoint. The tokenizer
is minivllm/tokenizer.py; conversion to an HF directory is minivllm/gguf_convert.py.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from minivllm.gguf_experts import MOE_ARCHITECTURES, gguf_moe_fields, split_expert_stack
from minivllm.gguf_hybrid import (
    HYBRID_ARCHITECTURES,
    HYBRID_LAYER_NAMES,
    gguf_hybrid_fields,
    hybrid_layout,
    hybrid_tensor,
)
from minivllm.gguf_types import check_tensor_types, checkpoint_dtype
from minivllm.layers.rotary import default_inv_freq, llama3_inv_freq

# GGUF general.architecture -> our (HF) architecture name.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    **{arch: names[0] for arch, names in HYBRID_ARCHITECTURES.items()},
}
# GGUF general.architecture -> transformers' model_type, where they differ.
_HF_MODEL_TYPES = {
    "qwen3moe": "qwen3_moe",
    **{arch: names[1] for arch, names in HYBRID_ARCHITECTURES.items()},
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Llama 3.1 / 3.2's rope_scaling but for `factor`; GGUF files keep only its effect (rope_freqs).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a MoE layer's router
    **HYBRID_LAYER_NAMES,
}


def find_gguf_file(model: str) -> str | None:
    """`model` itself if it is a .gguf file; the one .gguf of a directory without config.json;
    else None (an HF directory). Several .gguf files in one directory are a ValueError."""
    if os.path.isfile(model):
        return model if model.endswith(".gguf") else None
    if not os.path.isdir(model) or os.path.isfile(os.path.join(model, "config.json")):
        return None
    found = sorted(glob.glob(os.path.join(model, "*.gguf")))
    if len(found) > 1:
        names = [os.path.basename(p) for p in found]
        raise ValueError(f"{model!r} holds several .gguf files {names}; pass the one to load")
    return found[0] if found else None


def import_gguf(path: str):
    """The optional `gguf` package; its absence is a ValueError saying how to install it."""
    try:
        import gguf
    except ImportError as e:
        raise ValueError(
            f"loading {path!r} needs the `gguf` package: pip install gguf (or '.[gguf]')"
        ) from e
    return gguf


def open_gguf(path: str):
    """A gguf.GGUFReader over `path` (memory-mapped; tensors are read when touched). Parsing
    the metadata takes seconds for a large vocabulary (a view per token and merge), so the
    last file's reader is kept: the config and the weights of one load read it once."""
    try:
        stat = os.stat(path)
    except OSError as e:
        raise ValueError(f"cannot read GGUF file {path!r}: {e}") from e
    return _cached_reader(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _cached_reader(path: str, mtime_ns: int, size: int):
    """open_gguf's reader, keyed by the file's path, modification time and size (a file
    rewritten in place is read again)."""
    gguf = import_gguf(path)
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError) as e:
        raise ValueError(f"cannot read GGUF file {path!r} (corrupt or truncated?): {e}") from e


def gguf_architecture(path: str) -> str | None:
    """The file's general.architecture (llama.cpp's name: 'qwen3', 'qwen35moe', ...)."""
    return _field(open_gguf(path), "general.architecture")


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _required(reader, key: str) -> Any:
    value = _field(reader, key)
    if value is None:
        raise ValueError(f"the GGUF file has no {key!r} metadata")
    return value


def gguf_hf_config(reader) -> dict[str, Any]:
    """The checkpoint's hyperparameters as an HF config.json dict; an unsupported architecture
    or RoPE scaling is a ValueError."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {sorted(ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}
    heads = int(_required(reader, f"{arch}.attention.head_count"))
    hidden = int(_required(reader, f"{arch}.embedding_length"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    rope_theta = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    vocab = _field(reader, f"{arch}.vocab_size") or len(
        reader.get_field("tokenizer.ggml.tokens").data
    )
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": _HF_MODEL_TYPES.get(arch, arch),
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "num_hidden_layers": int(_required(reader, f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(_required(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_scaling": _rope_scaling(reader, arch, head_dim, rope_theta),
        "max_position_embeddings": int(_required(reader, f"{arch}.context_length")),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "torch_dtype": checkpoint_dtype(reader),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": None if eos is None else int(eos),
        **_family_fields(reader, arch, head_dim, names),
    }


def _family_fields(reader, arch: str, head_dim: int, names: set[str]) -> dict[str, Any]:
    """intermediate_size (a MoE file without dense MLPs may have none), the hybrid families'
    fields (num_hidden_layers without the MTP blocks) and the experts' fields."""
    field = lambda key, default: _field(reader, f"{arch}.{key}", default)  # noqa: E731
    fields: dict[str, Any] = {}
    ffn = field("feed_forward_length", None)
    if ffn is not None or arch not in MOE_ARCHITECTURES:
        fields["intermediate_size"] = int(_required(reader, f"{arch}.feed_forward_length"))
    if arch in HYBRID_ARCHITECTURES:
        fields.update(gguf_hybrid_fields(field, arch, head_dim))
    if arch in MOE_ARCHITECTURES:
        layers = fields.get("num_hidden_layers", int(_required(reader, f"{arch}.block_count")))
        dense = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in names]
        fields.update(gguf_moe_fields(field, arch, dense))
    return fields


def _rope_scaling(reader, arch: str, head_dim: int, rope_theta: float) -> dict | None:
    """None, or Llama 3's scaling recovered from the per-frequency divisors that llama.cpp
    stores as the rope_freqs tensor (Llama 3.1 and 3.2 share all but `factor`)."""
    import gguf

    rope_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if rope_type != "none":
        raise ValueError(f"GGUF RoPE scaling {rope_type!r} is not supported yet")
    if freqs is None:
        return None
    divisors = torch.from_numpy(np.array(gguf.quants.dequantize(freqs.data, freqs.tensor_type)))
    scaling = {**LLAMA3_ROPE, "factor": float(divisors.max())}
    expected = default_inv_freq(head_dim, rope_theta) / llama3_inv_freq(
        head_dim, rope_theta, scaling
    )
    if divisors.shape != expected.shape or not torch.allclose(divisors.float(), expected, 1e-4):
        raise ValueError(
            f"the GGUF's rope_freqs tensor is not Llama 3's RoPE scaling ({LLAMA3_ROPE} with "
            "any factor); other per-frequency scalings are not supported"
        )
    return scaling


def read_gguf_config(path: str) -> dict[str, Any]:
    """The HF config dict of a .gguf file; checks architecture, RoPE and tensor types up front."""
    reader = open_gguf(path)
    config = gguf_hf_config(reader)
    check_tensor_types(reader)
    return config


def hf_tensor_name(name: str) -> str:
    """GGUF tensor name -> HF name ('blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.
    weight'); an unknown name is returned unchanged (the loader then lists it)."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    return name


def _unpermute_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order: it stores each head's rotary pairs interleaved
    (rows [h, d/2, 2]) where HF keeps halves (rows [h, 2, d/2])."""
    rows = weight.shape[0]
    split = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def _permuted_qk_heads(reader) -> tuple[int, int] | None:
    """(q heads, kv heads) of a Llama file, whose q/k rows llama.cpp reordered; else None."""
    arch = _field(reader, "general.architecture")
    if ARCHITECTURES.get(arch) != "LlamaForCausalLM":
        return None
    heads = int(_required(reader, f"{arch}.attention.head_count"))
    return heads, int(_field(reader, f"{arch}.attention.head_count_kv", heads))


def iterate_gguf_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (HF name, float32 tensor) for every tensor of the file, dequantized; a MoE
    layer's expert stack as one tensor an expert (gguf_experts.py)."""
    return dequantized_tensors(open_gguf(path))


def dequantized_tensors(reader) -> Iterator[tuple[str, torch.Tensor]]:
    """Like iterate_gguf_tensors over an open reader (parsing a file's metadata takes seconds)."""
    import gguf

    check_tensor_types(reader)
    qk_heads = _permuted_qk_heads(reader)
    arch = _field(reader, "general.architecture")
    layout = None
    if arch in HYBRID_ARCHITECTURES:
        layout = hybrid_layout(gguf_hf_config(reader), arch)
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":  # in the config as rope_scaling
            continue
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        name = hf_tensor_name(tensor.name)
        if qk_heads is not None and ".self_attn.q_proj." in name:
            weight = _unpermute_rows(weight, qk_heads[0])
        elif qk_heads is not None and ".self_attn.k_proj." in name:
            weight = _unpermute_rows(weight, qk_heads[1])
        # Copied: the reader's arrays are read-only views of the memory-mapped file.
        weight = torch.from_numpy(np.array(weight, dtype=np.float32))
        if layout is not None:
            name, weight = hybrid_tensor(layout, tensor.name, name, weight)
        if name.startswith("mtp."):  # an MTP block's tensor: not loaded, not split
            yield name, weight
            continue
        yield from split_expert_stack(tensor.name, weight) or [(name, weight)]
