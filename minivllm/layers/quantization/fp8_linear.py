"""The block-FP8 linear method: a linear layer's weight in e4m3 [out, in] and its float32 scale
per 128 x 128 block [cdiv(out, 128), cdiv(in, 128)], both loaded through the layer's own
`ShardPlan` (packed q/k/v and gate/up, tensor-parallel slices), and its GEMM."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.layers.linear import LinearBase, ShardPlan, load_shard
from minivllm.layers.quantization.config import BLOCK, QuantConfig
from minivllm.layers.quantization.fp8_math import FP8_DTYPE, BlockFp8Gemm, quantize_weight_blocks


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_plan(plan: ShardPlan | None, block: int, layer: str) -> ShardPlan | None:
    """The weight's plan in scale rows (or columns): a slice of whole blocks. A tensor loaded
    whole may end in a partial block; a slice must start and end on block edges."""
    if plan is None or (plan.size == plan.full_size and plan.offset == 0):
        if plan is None:
            return None
        full = _cdiv(plan.full_size, block)
        return ShardPlan(plan.dim, 0, full, full)
    if plan.size % block or plan.offset % block:
        raise ValueError(
            f"{layer}: a slice of {plan.size} {'rows' if plan.dim == 0 else 'columns'} at "
            f"{plan.offset} does not fall on FP8 blocks of {block} (packed shards and "
            "tensor-parallel slices of a block-FP8 weight must be multiples of 128)"
        )
    return ShardPlan(
        plan.dim, plan.index, plan.size // block, plan.full_size // block, plan.offset // block
    )


class Fp8BlockLinearMethod:
    """`LinearMethod` (layers/ops.py) for block-wise FP8 checkpoints; with
    `quant.quantize_at_load` an unquantized checkpoint's weights are quantized as they load."""

    def __init__(self, quant: QuantConfig, gemm: BlockFp8Gemm) -> None:
        self.quant = quant
        self.gemm = gemm

    def create_weights(self, layer: nn.Module) -> None:
        assert isinstance(layer, LinearBase)
        out, inp = layer.output_size, layer.input_size
        weight = nn.Parameter(torch.empty(out, inp, dtype=FP8_DTYPE), requires_grad=False)
        scale = nn.Parameter(
            torch.empty(_cdiv(out, BLOCK[0]), _cdiv(inp, BLOCK[1]), dtype=torch.float32),
            requires_grad=False,
        )
        layer.weight = weight
        layer.register_parameter(self.quant.scale_name, scale)
        weight.weight_loader = lambda p, w, shard_id=None: self.load_weight(layer, p, w, shard_id)
        scale.weight_loader = lambda p, s, shard_id=None: self.load_scale(layer, p, s, shard_id)
        if self.quant.quantize_at_load:
            scale.filled_by_weight = True  # the checkpoint has none: load_weight makes it
        # Dummy weights: e4m3 values ~ N(0, 1) at scale 0.02 give weights ~ N(0, 0.02).
        weight.dummy_std, scale.dummy_value = 1.0, 0.02

    def load_weight(
        self, layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor, shard_id: object
    ) -> None:
        if loaded.dtype == FP8_DTYPE:
            _load_parts(layer, param, loaded, shard_id)
            return
        if not self.quant.quantize_at_load:
            raise ValueError(
                f"the checkpoint's tensor is {loaded.dtype}, where its quantization_config "
                f"({self.quant.method}) says {FP8_DTYPE}"
            )
        # Quantized whole, then sliced: the same blocks as quantizing this rank's slice.
        q, s = quantize_weight_blocks(loaded, BLOCK)
        _load_parts(layer, param, q, shard_id)
        self.load_scale(layer, getattr(layer, self.quant.scale_name), s, shard_id)

    def load_scale(
        self, layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor, shard_id: object
    ) -> None:
        # A tensor stacking several parts (checkpoint_parts) is cut at their blocks.
        for part_id, part in layer.checkpoint_parts(loaded, shard_id, BLOCK[0]):
            plan = _weight_plan(layer, part_id)
            block = BLOCK[0] if plan is None or plan.dim == 0 else BLOCK[1]
            name = type(layer).__name__
            load_shard(param, part.float(), scale_plan(plan, block, name))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.gemm(x, layer.weight, getattr(layer, self.quant.scale_name), bias)


def _weight_plan(layer: LinearBase, shard_id: object) -> ShardPlan | None:
    return layer.shard_plan(shard_id)


def _load_parts(
    layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor, shard_id: object
) -> None:
    """The weight's parts (layer.checkpoint_parts), each by its plan."""
    for part_id, part in layer.checkpoint_parts(loaded, shard_id):
        load_shard(param, part, _weight_plan(layer, part_id))
