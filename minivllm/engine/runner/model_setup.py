"""The model on one device (one TP rank): its attention backend, its layers' GEMM and
all-reduce (chosen once), its weights, and the routed-experts buffer sized for its largest
forward."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.attention.base import AttentionBackend
from minivllm.attention.selector import get_attn_backend
from minivllm.distributed.all_reduce import create_symm_buffer
from minivllm.engine.runner.graphs.piecewise_graph import mixed_graph_sizes
from minivllm.engine.runner.routed_experts import RoutedExpertsCapture
from minivllm.engine.setup import EngineSetup
from minivllm.layers.invariant_gemm import InvariantGemm
from minivllm.layers.ops import layer_ops
from minivllm.layers.tuned_gemm import TunedGemm
from minivllm.model_loader import build_model


def max_forward_rows(setup: EngineSetup) -> int:
    """The most token rows one forward runs (a step's budget, or a decode of every seat)."""
    return max(setup.limits.max_num_batched_tokens, setup.limits.max_num_seqs)


def load_model(setup: EngineSetup, device: torch.device) -> tuple[nn.Module, AttentionBackend]:
    """The model with its weights on `device` (the rank's), and its attention backend."""
    config, model_config = setup.config, setup.model_config
    tp_size = config.tensor_parallel_size
    attn_backend = get_attn_backend(
        config.attention_backend,
        device,
        num_heads=model_config.num_attention_heads // tp_size,
        head_dim=model_config.head_dim,
        max_num_seqs=setup.limits.max_num_seqs,
        max_model_len=setup.max_model_len,
        num_kv_heads=max(1, model_config.num_key_value_heads // tp_size),
        deterministic=config.deterministic,
        prefill_kernel=config.prefill_attention_kernel,
    )
    # The layers' GEMM and all-reduces, chosen once; the symmetric-memory buffer (collective)
    # before profiling and graph capture, which must see the all-reduce the steps use.
    symm = None
    if tp_size > 1 and device.type == "cuda" and not config.disable_custom_all_reduce:
        symm = create_symm_buffer(device)
    max_rows = max_forward_rows(setup)
    ops = layer_ops(config.deterministic, symm, device, max_rows, single_rank=tp_size == 1)
    model = build_model(
        model_config,
        attn_backend,
        dtype=setup.dtype,
        device=device,
        model_dir=config.model,
        load_format=config.load_format,
        seed=config.seed,
        ops=ops,
        quant=setup.quantization,
    )
    if isinstance(ops.gemm, InvariantGemm | TunedGemm):
        ops.gemm.verify_model(model, device)
    return model, attn_backend


def routed_experts_capture(
    setup: EngineSetup, model: nn.Module, device: torch.device
) -> RoutedExpertsCapture | None:
    """The routed experts' static buffer (enable_return_routed_experts; None: off), allocated
    before the memory profile (which counts it), with a row for each row of the largest
    forward (a piecewise graph's bucket rounds up)."""
    if setup.routed_experts is None:
        return None
    rows = mixed_graph_sizes(max_forward_rows(setup))[-1]
    return RoutedExpertsCapture(setup.routed_experts, model, rows, device)
