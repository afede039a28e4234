"""FusedMoE: a layer's experts stacked into two tensors, each rank holding its slice of every
expert's intermediate dim (as the dense MLP splits it), summed over ranks at the end."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.parallel_state import divide, get_tp_rank_size
from minivllm.layers.linear import copy_checked, take_shard
from minivllm.layers.moe_experts import experts_torch
from minivllm.layers.ops import DEFAULT_OPS, LayerOps

# shard_id (expert, part) of a checkpoint tensor: part "gate" and "up" are [I, H] and go
# into gate_up_proj[expert]; "down" is [H, I] and goes into down_proj[expert].
EXPERT_PARTS = ("gate", "up", "down")


class FusedMoE(nn.Module):
    """gate_up_proj: [E, 2 * I / tp, H] (this rank's gate rows, then its up rows);
    down_proj: [E, H, I / tp]. use_triton: the fused kernels (kernels/moe/), else the torch
    definition (layers/moe_experts.py)."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        dtype: torch.dtype | None,
        use_triton: bool = False,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__()
        if ops.linear_method is not None:
            raise ValueError(
                "FP8 weights are not supported for mixture-of-experts layers yet (the dense "
                "layers of Qwen3 and Llama load them); run the model's bf16 checkpoint"
            )
        self.tp_rank, self.tp_size = get_tp_rank_size()
        self.num_experts = num_experts
        self.inter = divide(intermediate_size, self.tp_size, "moe_intermediate_size")
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * self.inter, hidden_size, dtype=dtype),
            requires_grad=False,
        )
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, self.inter, dtype=dtype), requires_grad=False
        )
        self.gate_up_proj.weight_loader = self.weight_loader
        self.down_proj.weight_loader = self.weight_loader
        self.gemm = ops.gemm
        self.reduce = ops.row_reduce
        self.use_triton = use_triton
        if use_triton:
            from minivllm.kernels.moe.fused_moe import fused_moe  # Triton: only when it runs

            self._fused_moe = fused_moe

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """loaded_weight: one expert's full checkpoint tensor; shard_id (expert, part)."""
        if (
            not isinstance(shard_id, tuple)
            or len(shard_id) != 2
            or shard_id[1] not in EXPERT_PARTS
            or not 0 <= shard_id[0] < self.num_experts
        ):
            raise ValueError(
                f"expert weights need shard_id (expert in 0..{self.num_experts - 1}, part in "
                f"{EXPERT_PARTS}), got {shard_id!r}"
            )
        expert, part = shard_id
        size, full = self.inter, self.inter * self.tp_size
        if part == "down":
            src = take_shard(loaded_weight, 1, self.tp_rank, size, full)
            copy_checked(param.data[expert], src)
            return
        src = take_shard(loaded_weight, 0, self.tp_rank, size, full)
        offset = 0 if part == "gate" else size
        copy_checked(param.data[expert].narrow(0, offset, size), src)

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """x: [num_tokens, H]; topk_weights float32 and topk_ids: [num_tokens, top_k]
        -> [num_tokens, H], the weighted sum of each token's experts over all ranks."""
        w13, w2 = self.gate_up_proj, self.down_proj
        if self.use_triton:
            out = self._fused_moe(x, w13, w2, topk_weights, topk_ids)
        else:
            out = experts_torch(x, w13, w2, topk_weights, topk_ids, self.gemm)
        return self.reduce(out, self.tp_size)
