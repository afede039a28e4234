"""EngineSetup: the engine's configuration resolved once (device, dtypes, lengths, scheduler
limits), by EngineCore, and handed down to the executor, the runners and the TP workers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.config import EngineConfig
from minivllm.engine.sched.limits import SchedulerLimits, auto_scheduler_limits
from minivllm.engine.types import RoutedExpertsSpec
from minivllm.layers.quantization.config import QuantConfig, resolve_quantization
from minivllm.models.model_config import ModelConfig


@dataclass(frozen=True)
class EngineSetup:
    """Plain data (it is pickled to TP worker processes). Options used as given are read
    from `config`; what is derived from them lives here, and nothing below derives it again."""

    config: EngineConfig
    model_config: ModelConfig
    device: torch.device  # the replica's device kind; a TP rank runs on its own index of it
    dtype: torch.dtype  # the model's weights and activations
    kv_cache_dtype: torch.dtype
    max_model_len: int
    limits: SchedulerLimits  # max_num_seqs, max_num_batched_tokens
    quantization: QuantConfig | None = None  # the linear layers' block FP8; None: unquantized
    # enable_return_routed_experts: the shape of a token's routed experts; None: off.
    routed_experts: RoutedExpertsSpec | None = None


def resolve_setup(config: EngineConfig, model_config: ModelConfig) -> EngineSetup:
    """Raises ValueError for a device that is not there or a max_model_len the model cannot
    take. The limits are the rank-0 device's (every rank of a replica is the same GPU kind)."""
    max_model_len = config.resolved_max_model_len(model_config)
    device = config.resolved_device()
    dtype = config.resolved_dtype(model_config, device)
    return EngineSetup(
        config=config,
        model_config=model_config,
        device=device,
        dtype=dtype,
        kv_cache_dtype=config.resolved_kv_cache_dtype(dtype),
        max_model_len=max_model_len,
        limits=resolve_scheduler_limits(config, device),
        quantization=resolve_quantization(config.quantization, model_config.quantization),
        routed_experts=routed_experts_spec(config, model_config),
    )


def routed_experts_spec(
    config: EngineConfig, model_config: ModelConfig
) -> RoutedExpertsSpec | None:
    """The routed experts' shape when enable_return_routed_experts is on (None: off); a
    ValueError for a model without experts."""
    if not config.enable_return_routed_experts:
        return None
    moe = model_config.moe
    if moe is None:
        raise ValueError(
            f"enable_return_routed_experts: {model_config.architecture} has no "
            "mixture-of-experts layers, so no token is routed to experts"
        )
    num_layers = sum(moe.is_sparse(i) for i in range(model_config.num_hidden_layers))
    return RoutedExpertsSpec(num_layers, moe.num_experts_per_tok, moe.num_experts)


def resolve_scheduler_limits(config: EngineConfig, device: torch.device) -> SchedulerLimits:
    """The limits the engine runs with: explicit config values win, None means auto (from the
    device's memory and name, read here: the scheduler's folder reads no device)."""
    total_memory, name = 0, ""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        total_memory, name = props.total_memory, props.name
    auto = auto_scheduler_limits(total_memory, device.type, config.usage_context, name)
    return SchedulerLimits(
        auto.max_num_seqs if config.max_num_seqs is None else config.max_num_seqs,
        auto.max_num_batched_tokens
        if config.max_num_batched_tokens is None
        else config.max_num_batched_tokens,
    )
