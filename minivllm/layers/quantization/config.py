"""QuantConfig: a checkpoint's weight quantization, read from config.json's quantization_config
(Qwen's and DeepSeek's `fp8`, compressed-tensors' block FP8), or asked for with
`quantization="fp8"` on an unquantized checkpoint (quantized at load). Anything else is a
ValueError naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The one weight block the FP8 GEMM runs (kernels/fp8_gemm.py: BLOCK_K = 128).
BLOCK = (128, 128)
SUPPORTED_METHODS = ("fp8", "compressed-tensors")
# Layers minivllm never quantizes: an ignore list naming them asks for what happens anyway.
UNQUANTIZED_LAYERS = (
    "lm_head", "embed_tokens", "mlp.gate", "mlp.shared_expert_gate",
    # Gated DeltaNet's b and a projections (Qwen3-Next's fused in_proj_ba)
    "linear_attn.in_proj_b", "linear_attn.in_proj_a", "linear_attn.in_proj_ba",
)  # fmt: skip


@dataclass(frozen=True)
class QuantConfig:
    """Block-wise FP8 weights (W8A8: e4m3, one float32 scale per 128 x 128 block; activations
    quantized per token-group of 128 at run time)."""

    method: str  # the checkpoint's quant_method, or "fp8" for quantize_at_load
    scale_name: str = "weight_scale_inv"  # compressed-tensors: "weight_scale"
    ignored: tuple[str, ...] = ()  # checkpoint module names (or "re:" patterns) left unquantized
    quantize_at_load: bool = False  # an unquantized checkpoint, quantized as it loads


def quant_config_from_hf(hf: dict[str, Any]) -> QuantConfig | None:
    """config.json's quantization_config, or None when it has none."""
    qc = hf.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"config.json: quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method == "fp8":
        return _fp8(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    raise ValueError(
        f"config.json: quantization_config.quant_method {method!r} is not supported; "
        f"minivllm loads {list(SUPPORTED_METHODS)} (block-wise FP8)"
    )


def _fp8(qc: dict[str, Any]) -> QuantConfig:
    block = qc.get("weight_block_size")
    if block is None:
        raise ValueError(
            "config.json: quantization_config (fp8) has no weight_block_size; minivllm loads "
            f"block-wise FP8 ({list(BLOCK)}), not per-tensor FP8"
        )
    _check_block(block, "weight_block_size")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(
            f"config.json: quantization_config.activation_scheme {scheme!r} is not supported "
            "(minivllm quantizes activations dynamically)"
        )
    ignored = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or []
    return QuantConfig("fp8", "weight_scale_inv", _names(ignored, "modules_to_not_convert"))


def _compressed_tensors(qc: dict[str, Any]) -> QuantConfig:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ValueError(
            "config.json: compressed-tensors quantization_config needs exactly one entry in "
            f"config_groups (block FP8), got {groups!r}"
        )
    group = next(iter(groups.values()))
    weights = group.get("weights") or {}
    if (weights.get("type"), weights.get("num_bits"), weights.get("strategy")) != (
        "float", 8, "block"
    ):  # fmt: skip
        raise ValueError(
            "config.json: compressed-tensors weights must be float, 8 bits, strategy 'block' "
            f"(block FP8); got {weights!r}"
        )
    _check_block(weights.get("block_structure"), "weights.block_structure")
    acts = group.get("input_activations") or {}
    if not acts.get("dynamic", False) or acts.get("strategy") not in ("group", "token"):
        raise ValueError(
            "config.json: compressed-tensors input_activations must be dynamic per token "
            f"group (minivllm quantizes activations per token and 128 inputs); got {acts!r}"
        )
    return QuantConfig(
        "compressed-tensors", "weight_scale", _names(qc.get("ignore") or [], "ignore")
    )


def _check_block(block: Any, name: str) -> None:
    if list(block or []) != list(BLOCK):
        raise ValueError(
            f"config.json: quantization_config {name} {block!r} is not supported; "
            f"minivllm's FP8 GEMM runs {list(BLOCK)} blocks"
        )


def _names(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"config.json: quantization_config.{name} must be a list of names")
    return tuple(value)


def resolve_quantization(
    requested: str | None, checkpoint: QuantConfig | None
) -> QuantConfig | None:
    """The engine's `quantization` option against the checkpoint's: None takes the
    checkpoint's; "fp8" takes a block-FP8 checkpoint as it is and quantizes an unquantized one
    at load (128 x 128 blocks, as the FP8 checkpoints are)."""
    if requested is None:
        return checkpoint
    if requested != "fp8":
        raise ValueError(f"quantization must be 'fp8' or None, got {requested!r}")
    return checkpoint or QuantConfig("fp8", quantize_at_load=True)
