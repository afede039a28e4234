"""LinearAttentionConfig: the Gated DeltaNet hyperparameters of a hybrid config.json (Qwen3.5's
names), which layers are linear attention and which are full attention, and the bytes of one
request's recurrent state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


@dataclass(frozen=True)
class LinearAttentionConfig:
    layer_types: tuple[str, ...]  # one per layer: FULL_ATTENTION or LINEAR_ATTENTION
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v side by side."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def num_linear_layers(self) -> int:
        return self.layer_types.count(LINEAR_ATTENTION)

    def is_linear(self, layer_idx: int) -> bool:
        return self.layer_types[layer_idx] == LINEAR_ATTENTION


def linear_attention_config_from_hf(hf: dict[str, Any], num_layers: int) -> LinearAttentionConfig:
    """A ValueError names a missing or bad field. Without layer_types, every
    full_attention_interval-th layer is full attention (default 4, as transformers has it)."""
    layer_types = hf.get("layer_types")
    if layer_types is None:
        interval = hf.get("full_attention_interval", 4)
        layer_types = [
            FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION
            for i in range(num_layers)
        ]
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ValueError(f"config.json: layer_types must list {num_layers} layer types")
    bad = set(layer_types) - {FULL_ATTENTION, LINEAR_ATTENTION}
    if bad:
        raise ValueError(f"config.json: layer_types has unknown types {sorted(bad)}")
    fields = {
        "num_k_heads": "linear_num_key_heads",
        "num_v_heads": "linear_num_value_heads",
        "head_k_dim": "linear_key_head_dim",
        "head_v_dim": "linear_value_head_dim",
        "conv_kernel_size": "linear_conv_kernel_dim",
    }
    values = {}
    for name, key in fields.items():
        value = hf.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
        values[name] = value
    if values["num_v_heads"] % values["num_k_heads"]:
        raise ValueError(
            "config.json: linear_num_value_heads must be a multiple of linear_num_key_heads"
        )
    return LinearAttentionConfig(layer_types=tuple(layer_types), **values)
