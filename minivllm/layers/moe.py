"""A sparse MoE block (Qwen3-MoE's `mlp` on sparse layers): the router, a linear layer
replicated on every rank, picks each token's top-k experts (layers/moe_router.py; on CUDA its
Triton launch); FusedMoE runs them. SharedExpertMoeBlock (Qwen3.5-MoE) adds a dense MLP that
every token goes through, scaled by a sigmoid gate."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from minivllm.layers.fused_moe import FusedMoE
from minivllm.layers.linear import ReplicatedLinear
from minivllm.layers.moe_router import route
from minivllm.layers.ops import DEFAULT_OPS, LayerOps


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        norm_topk_prob: bool,
        dtype: torch.dtype | None,
        use_triton: bool = False,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        """intermediate_size: one expert's (before the TP split)."""
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        # The checkpoint's name for the router (mlp.gate.weight); never quantized (FP8
        # checkpoints keep it in bf16).
        router_ops = replace(ops, linear_method=None)
        self.gate = ReplicatedLinear(hidden_size, num_experts, False, dtype, router_ops)
        self.experts = FusedMoE(num_experts, hidden_size, intermediate_size, dtype, use_triton, ops)
        self._route = route
        if use_triton:
            from minivllm.kernels.moe.router import topk_softmax  # Triton: only when it runs

            self._route = topk_softmax
        # enable_return_routed_experts: this layer's column of the runner's static routing
        # buffer, [max_tokens, top_k] (engine/runner/routed_experts.py); None: not recorded.
        self.routed_ids: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, hidden_size] -> [num_tokens, hidden_size]."""
        topk_weights, topk_ids = self._route(self.gate(x), self.top_k, self.norm_topk_prob)
        if self.routed_ids is not None:  # a static buffer: CUDA graphs replay the copy
            self.routed_ids[: topk_ids.shape[0]].copy_(topk_ids)
        return self.experts(x, topk_weights, topk_ids)


def _partial_sum(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    return x  # this rank's part: the block adds the parts over the ranks once


def partial_sum_ops(ops: LayerOps) -> LayerOps:
    """ops whose row-parallel layers leave their partial sums to their caller: a
    SharedExpertMoeBlock's shared expert and routed experts, whose sum is reduced once."""
    return replace(ops, row_reduce=_partial_sum)


class SharedExpertMoeBlock(SparseMoeBlock):
    """The routed experts plus `shared_expert` (a dense MLP, tensor-parallel as any, built
    with partial_sum_ops(ops)), its output scaled per token by sigmoid(shared_expert_gate(x)),
    as transformers' Qwen3_5MoeSparseMoeBlock. Names as in its checkpoints. Under tensor
    parallelism each rank adds its parts of both and the sum is all-reduced once (the gate is
    per token, so scaling a part scales the sum)."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        norm_topk_prob: bool,
        shared_expert: nn.Module,
        dtype: torch.dtype | None,
        use_triton: bool = False,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__(
            hidden_size, num_experts, top_k, intermediate_size, norm_topk_prob, dtype,
            use_triton, partial_sum_ops(ops),
        )  # fmt: skip
        self.reduce, self.tp_size = ops.row_reduce, self.experts.tp_size
        self.shared_expert = shared_expert
        # One row: never quantized (as the router).
        gate_ops = replace(ops, linear_method=None)
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, False, dtype, gate_ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, hidden_size] -> [num_tokens, hidden_size]."""
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.reduce(super().forward(x) + shared, self.tp_size)
