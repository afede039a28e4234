"""ModelConfig: a decoder's hyperparameters (its experts' in `moe`, models/moe_config.py), read
from an HF config.json or a GGUF file's metadata and validated on construction."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from minivllm.gguf_loader import find_gguf_file, read_gguf_config
from minivllm.layers.quantization.config import QuantConfig, quant_config_from_hf
from minivllm.models.hybrid_config import LinearAttentionConfig, linear_attention_config_from_hf
from minivllm.models.moe_config import MoeConfig, moe_config_from_hf
from minivllm.models.registry import check_architecture, supported_architectures


@dataclass(frozen=True)
class ModelConfig:
    """The hyperparameters of a decoder model, read from an HF config.json."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's; 0 where every layer's MLP is experts
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    torch_dtype: str  # the checkpoint's dtype: "float32" | "float16" | "bfloat16"
    rope_scaling: dict[str, Any] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    moe: MoeConfig | None = None  # None: every layer has a dense MLP
    # Hybrid models (Qwen3.5): which layers are Gated DeltaNet, and their sizes; None: all
    # layers are full attention.
    linear_attention: LinearAttentionConfig | None = None
    partial_rotary_factor: float = 1.0  # the fraction of head_dim that RoPE rotates
    # The checkpoint's quantization_config (block FP8); None: unquantized weights.
    quantization: QuantConfig | None = None

    @property
    def num_kv_layers(self) -> int:
        """The layers with a paged KV cache: all, but a hybrid model's full-attention ones."""
        if self.linear_attention is None:
            return self.num_hidden_layers
        return self.num_hidden_layers - self.linear_attention.num_linear_layers

    @classmethod
    def from_hf(cls, model_dir: str) -> ModelConfig:
        """Reads config.json as written by transformers 4 (rope_theta, rope_scaling,
        torch_dtype) or 5 (rope_parameters, dtype), or a GGUF file's metadata."""
        gguf_file = find_gguf_file(model_dir)
        if gguf_file is not None:
            return cls.from_dict(read_gguf_config(gguf_file))
        path = os.path.join(model_dir, "config.json")
        if not os.path.isfile(path):
            raise ValueError(f"no config.json in model directory {model_dir!r}")
        try:
            with open(path) as f:
                hf = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(hf, dict):
            raise ValueError(f"{path} must hold a JSON object, not a {type(hf).__name__}")
        return cls.from_dict(hf)

    @classmethod
    def from_dict(cls, hf: dict[str, Any]) -> ModelConfig:
        """Raises ValueError for an unsupported architecture or a missing or bad size."""
        arch = _architecture(hf)
        if arch in _TEXT_CONFIG_ARCHITECTURES:
            hf = _text_config(hf, arch)
        sizes = {key: _positive_int(hf, key, arch) for key in _REQUIRED_SIZES}
        sizes["intermediate_size"] = _intermediate_size(hf, arch)
        heads = sizes["num_attention_heads"]
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_theta = float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None if rope_type in (None, "default") else {**rope, "rope_type": rope_type}
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            **sizes,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or sizes["hidden_size"] // heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            # Qwen2 has q/k/v biases without saying so in its config.
            attention_bias=bool(hf.get("attention_bias", arch == "Qwen2ForCausalLM")),
            torch_dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "float32"),
            rope_scaling=rope_scaling,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            moe=_moe(hf, arch),
            linear_attention=(
                linear_attention_config_from_hf(hf, sizes["num_hidden_layers"])
                if arch in _HYBRID_ARCHITECTURES
                else None
            ),
            # transformers 5 keeps it in rope_parameters; 4 (Qwen3-Next's config) at the top.
            partial_rotary_factor=float(
                rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
            ),
            quantization=quant_config_from_hf(hf),
        )


_REQUIRED_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def _architecture(hf: dict[str, Any]) -> str:
    """The supported architecture named first in config.json; checked before any size, so
    that another family's config (GPT-2 has no num_attention_heads) says what it is."""
    archs = hf.get("architectures") or []
    if not isinstance(archs, list) or not archs:
        raise ValueError(
            f"config.json has no 'architectures' list; supported: {supported_architectures()}"
        )
    check_architecture(archs[0])
    return archs[0]


# Architectures whose sparse layers need the MoE fields of config.json -> norm_topk_prob where
# config.json has none (transformers' Qwen3.5-MoE router always renormalizes).
_MOE_ARCHITECTURES = {
    "Qwen3MoeForCausalLM": False,
    "Qwen3_5MoeForCausalLM": True,
    "Qwen3_5MoeForConditionalGeneration": True,
    "Qwen3NextForCausalLM": True,
}
# MoE architectures whose every layer's MLP is experts: their config.json may have no
# intermediate_size (no dense MLP).
_EXPERTS_ONLY_ARCHITECTURES = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")


# Architectures whose layers mix Gated DeltaNet and full attention.
_HYBRID_ARCHITECTURES = (
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
)
# Architectures whose language model's fields sit under "text_config" (a vision tower beside).
_TEXT_CONFIG_ARCHITECTURES = (
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)


def _text_config(hf: dict[str, Any], arch: str) -> dict[str, Any]:
    """The language model's fields (text_config's), with the top level's architectures and
    token ids where text_config lacks them."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"config.json has no 'text_config' object, which {arch} needs")
    return {**{k: v for k, v in hf.items() if k != "text_config"}, **text,
            "architectures": hf["architectures"]}  # fmt: skip


def _moe(hf: dict[str, Any], arch: str) -> MoeConfig | None:
    if arch not in _MOE_ARCHITECTURES:
        return None
    moe = moe_config_from_hf(hf, _MOE_ARCHITECTURES[arch])
    if moe is None:
        raise ValueError(f"config.json has no 'num_experts', which {arch} needs")
    return moe


def _intermediate_size(hf: dict[str, Any], arch: str) -> int:
    if arch in _EXPERTS_ONLY_ARCHITECTURES and "intermediate_size" not in hf:
        return 0
    return _positive_int(hf, "intermediate_size", arch)


def _positive_int(hf: dict[str, Any], key: str, arch: str) -> int:
    if key not in hf:
        raise ValueError(f"config.json has no {key!r}, which {arch} needs")
    value = hf[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value
