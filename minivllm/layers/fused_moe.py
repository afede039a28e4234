"""FusedMoE: a layer's experts stacked into two tensors, each rank holding its slice of every
expert's intermediate dim (as the dense MLP splits it), summed over ranks at the end. With the
block-FP8 method (layers/quantization/) the stacks are e4m3 with a float32 scale per 128 x 128
block of each expert (`<param>_<scale name>`, [E, row blocks, column blocks])."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.parallel_state import divide, get_tp_rank_size
from minivllm.layers.linear import copy_checked, take_shard
from minivllm.layers.moe_experts import experts_torch
from minivllm.layers.ops import DEFAULT_OPS, LayerOps
from minivllm.layers.quantization.fp8_linear import Fp8BlockLinearMethod
from minivllm.layers.quantization.fp8_math import FP8_DTYPE, quantize_weight_blocks

# shard_id (expert, part) of a checkpoint tensor: part "gate" and "up" are [I, H] and go
# into gate_up_proj[expert]; "down" is [H, I] and goes into down_proj[expert].
EXPERT_PARTS = ("gate", "up", "down")
FP8_BLOCK = 128


class FusedMoE(nn.Module):
    """gate_up_proj: [E, 2 * I / tp, H] (this rank's gate rows, then its up rows);
    down_proj: [E, H, I / tp]. use_triton: the fused kernels (kernels/moe/), else the torch
    definition (layers/moe_experts.py); in deterministic mode (ops.batch_invariant) the fused
    kernels' batch-invariant path."""

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
        self.tp_rank, self.tp_size = ops.tp or get_tp_rank_size()
        self.num_experts = num_experts
        self.inter = divide(intermediate_size, self.tp_size, "moe_intermediate_size")
        self.quant = _fp8_method(ops, self.inter)
        weight_dtype = dtype if self.quant is None else FP8_DTYPE
        shapes = {
            "gate_up_proj": (num_experts, 2 * self.inter, hidden_size),
            "down_proj": (num_experts, hidden_size, self.inter),
        }
        self.scale_names: dict[str, str] = {}  # weight -> its scale parameter (FP8)
        for name, shape in shapes.items():
            param = nn.Parameter(torch.empty(shape, dtype=weight_dtype), requires_grad=False)
            param.weight_loader = self.weight_loader
            self.register_parameter(name, param)
            if self.quant is not None:
                self._add_scale(name, shape)
        # The torch path's GEMM per expert (not named `gemm`: the GEMM choosers look for the
        # layers with a 2-D `weight` by that name, layers/invariant_gemm.py model_shapes).
        self.expert_gemm = ops.gemm if self.quant is None else ops.block_fp8_gemm
        self.reduce = ops.row_reduce
        self.use_triton = use_triton
        self.batch_invariant = ops.batch_invariant
        if use_triton:
            from minivllm.kernels.moe.fused_moe import fused_moe  # Triton: only when it runs

            self._fused_moe = fused_moe

    def _add_scale(self, name: str, shape: tuple[int, int, int]) -> None:
        blocks = (shape[0], -(-shape[1] // FP8_BLOCK), -(-shape[2] // FP8_BLOCK))
        scale = nn.Parameter(torch.empty(blocks, dtype=torch.float32), requires_grad=False)
        scale.weight_loader = self.weight_loader
        scale.is_scale = True
        if self.quant.quant.quantize_at_load:
            scale.filled_by_weight = True  # the checkpoint has none: the weight's load makes it
        scale.dummy_value = 0.02
        getattr(self, name).dummy_std = 1.0
        self.scale_names[name] = f"{name}_{self.quant.quant.scale_name}"
        self.register_parameter(self.scale_names[name], scale)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """loaded_weight: one expert's full checkpoint tensor (or its block scales); shard_id
        (expert, part)."""
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
        if getattr(param, "is_scale", False):
            self._load_part(param, loaded_weight.float(), expert, part, FP8_BLOCK)
        elif self.quant is None or loaded_weight.dtype == FP8_DTYPE:
            self._load_part(param, loaded_weight, expert, part, 1)
        elif self.quant.quant.quantize_at_load:
            q, s = quantize_weight_blocks(loaded_weight)
            self._load_part(param, q, expert, part, 1)
            name = "down_proj" if part == "down" else "gate_up_proj"
            self._load_part(getattr(self, self.scale_names[name]), s, expert, part, FP8_BLOCK)
        else:
            raise ValueError(
                f"the checkpoint's tensor is {loaded_weight.dtype}, where its "
                f"quantization_config ({self.quant.quant.method}) says {FP8_DTYPE}"
            )

    def _load_part(
        self, param: nn.Parameter, src: torch.Tensor, expert: int, part: str, block: int
    ) -> None:
        """This rank's slice of one expert's part, in rows / columns of `block` (1: a weight,
        128: its block scales; inter / tp is a whole number of blocks, `_fp8_method`)."""
        size = self.inter // block
        full = -(-self.inter * self.tp_size // block)
        if part == "down":
            copy_checked(param.data[expert], take_shard(src, 1, self.tp_rank, size, full))
            return
        offset = 0 if part == "gate" else size
        dst = param.data[expert].narrow(0, offset, size)
        copy_checked(dst, take_shard(src, 0, self.tp_rank, size, full))

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """x: [num_tokens, H]; topk_weights float32 and topk_ids: [num_tokens, top_k]
        -> [num_tokens, H], the weighted sum of each token's experts over all ranks."""
        w13, w2 = self.gate_up_proj, self.down_proj
        scales = None
        if self.quant is not None:
            scales = (
                getattr(self, self.scale_names["gate_up_proj"]),
                getattr(self, self.scale_names["down_proj"]),
            )
        if self.use_triton:
            w13_scale, w2_scale = scales or (None, None)
            out = self._fused_moe(x, w13, w2, topk_weights, topk_ids, None, w13_scale, w2_scale,
                                  self.batch_invariant)  # fmt: skip
        else:
            out = experts_torch(x, w13, w2, topk_weights, topk_ids, self.expert_gemm, scales)
        return self.reduce(out, self.tp_size)


def _fp8_method(ops: LayerOps, inter: int) -> Fp8BlockLinearMethod | None:
    """The block-FP8 method of ops, or None; its experts' slices must be whole blocks."""
    method = ops.linear_method
    if method is None:
        return None
    if not isinstance(method, Fp8BlockLinearMethod):
        raise ValueError(f"mixture-of-experts layers do not take {type(method).__name__}")
    if inter % FP8_BLOCK:
        raise ValueError(
            f"block-FP8 experts need each rank's moe_intermediate_size ({inter}) to be a "
            f"multiple of {FP8_BLOCK}"
        )
    return method
