"""A model's layers under a QuantConfig: the LayerOps that give every linear layer the FP8
method, and the check that the checkpoint leaves none of those layers unquantized."""

from __future__ import annotations

import re
from dataclasses import replace

from torch import nn

from minivllm.layers.linear import LinearBase
from minivllm.layers.ops import LayerOps
from minivllm.layers.quantization.config import UNQUANTIZED_LAYERS, QuantConfig
from minivllm.layers.quantization.fp8_linear import Fp8BlockLinearMethod


def quantized_ops(ops: LayerOps, quant: QuantConfig | None) -> LayerOps:
    """ops whose linear layers hold block-FP8 weights (embeddings, the LM head and MoE routers
    stay unquantized: they do not take the method)."""
    if quant is None:
        return ops
    return replace(ops, linear_method=Fp8BlockLinearMethod(quant, ops.block_fp8_gemm))


def is_ignored(name: str, patterns: tuple[str, ...]) -> bool:
    """An ignore-list entry names a module exactly, by its last components, or ("re:...") by a
    regular expression matched from the start, as compressed-tensors writes them."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif name == pattern or name.endswith("." + pattern):
            return True
    return False


def check_ignored_layers(
    model: nn.Module, quant: QuantConfig, packed_mapping: dict[str, tuple[str, object]]
) -> None:
    """Raises ValueError if the checkpoint's ignore list names a layer that minivllm runs in
    FP8 (a checkpoint that keeps some projections in bf16 is not supported yet)."""
    if quant.quantize_at_load:
        return
    for name, module in model.named_modules():
        if not isinstance(module, LinearBase) or module.quant_method is None:
            continue
        for ckpt_name in _checkpoint_names(name, packed_mapping):
            if is_ignored(ckpt_name, quant.ignored):
                raise ValueError(
                    f"config.json: the quantization_config's ignore list names {ckpt_name!r}, "
                    "which minivllm runs in FP8; only "
                    f"{list(UNQUANTIZED_LAYERS)} may stay unquantized"
                )


def _checkpoint_names(name: str, packed_mapping: dict[str, tuple[str, object]]) -> list[str]:
    """A packed module's checkpoint names (qkv_proj: q_proj, k_proj, v_proj), else its own."""
    prefix, _, last = name.rpartition(".")
    parts = [ckpt for ckpt, (packed, _) in packed_mapping.items() if packed == last]
    return [f"{prefix}.{part}" for part in parts] if parts else [name]
