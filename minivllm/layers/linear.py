"""The tensor-parallel linear family.

Every parameter carries `weight_loader(param, loaded_weight, shard_id=None)`: it takes the
FULL checkpoint tensor and copies this rank's slice, as its `ShardPlan` says. Column-parallel
layers split the output dim (no communication); RowParallelLinear splits the input dim and
all-reduces its output. Each layer calls the GEMM and all-reduce of the LayerOps it is built with
(layers/ops.py); with a quantized `ops.linear_method` that method owns the weights and the GEMM
(layers/quantization/).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from minivllm.distributed.parallel_state import divide, get_tp_rank_size
from minivllm.layers.ops import DEFAULT_OPS, LayerOps


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) (casting dtype and device) after checking that the shapes agree."""
    if dst.shape != src.shape:
        raise ValueError(
            f"shape mismatch: checkpoint tensor (slice) {tuple(src.shape)} vs "
            f"parameter (slice) {tuple(dst.shape)}"
        )
    dst.copy_(src)


def take_shard(
    loaded_weight: torch.Tensor, dim: int, index: int, size: int, full_size: int
) -> torch.Tensor:
    """Slice `index` of `size` along `dim`, after checking the full tensor's extent there
    (a too-large tensor would otherwise load silently)."""
    if loaded_weight.dim() <= dim or loaded_weight.shape[dim] != full_size:
        raise ValueError(
            f"shape mismatch: checkpoint tensor {tuple(loaded_weight.shape)} should have "
            f"size {full_size} along dim {dim}"
        )
    return loaded_weight.narrow(dim, index * size, size)


@dataclass(frozen=True)
class ShardPlan:
    """Where this rank's part of a checkpoint tensor goes: `size` rows (dim 0) or columns
    (dim 1) at `index * size` of a tensor `full_size` long there, copied to `offset` of the
    parameter (packed layers hold several checkpoint tensors one after another)."""

    dim: int
    index: int
    size: int
    full_size: int
    offset: int = 0


def load_shard(param: torch.Tensor, loaded_weight: torch.Tensor, plan: ShardPlan | None) -> None:
    """Copies the plan's slice of loaded_weight into param (None: the whole tensor)."""
    if plan is None:
        copy_checked(param.data, loaded_weight)
        return
    src = take_shard(loaded_weight, plan.dim, plan.index, plan.size, plan.full_size)
    copy_checked(param.data.narrow(plan.dim, plan.offset, plan.size), src)


def split_stacked(loaded_weight: torch.Tensor, full_sizes: Sequence[int]) -> list[torch.Tensor]:
    """A checkpoint tensor that stacks parts of full_sizes rows (dim 0) -> the parts."""
    if loaded_weight.dim() == 0 or loaded_weight.shape[0] != sum(full_sizes):
        raise ValueError(
            f"shape mismatch: checkpoint tensor {tuple(loaded_weight.shape)} should stack "
            f"parts of {list(full_sizes)} rows"
        )
    return list(loaded_weight.split(list(full_sizes)))


def stacked_shard_loader(
    full_sizes: Sequence[int], tp_rank: int, tp_size: int
) -> Callable[..., None]:
    """The weight_loader of a parameter that is not a linear layer's but splits as a merged
    column-parallel weight does (Gated DeltaNet's conv1d channels, its per-head A_log): the
    checkpoint tensor stacks parts of full_sizes rows, each split over the ranks; this rank's
    slices go one after another."""
    sizes = [divide(n, tp_size, "stacked parameter's rows") for n in full_sizes]

    def load(param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: object = None) -> None:
        offset = 0
        for part, size in zip(split_stacked(loaded_weight, full_sizes), sizes, strict=True):
            load_shard(param, part, ShardPlan(0, tp_rank, size, size * tp_size, offset))
            offset += size

    return load


def default_weight_loader(
    param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: object = None
) -> None:
    copy_checked(param.data, loaded_weight)


class LinearBase(nn.Module):
    """y = x @ W.T (+ b) with W: [output_size, input_size] of this rank's shard."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype | None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = ops.tp or get_tp_rank_size()
        self.input_size = input_size
        self.output_size = output_size
        # None: unquantized, `weight` in dtype and ops.gemm; else the method makes its weights.
        self.quant_method = ops.linear_method
        if self.quant_method is None:
            self.weight = nn.Parameter(
                torch.empty(output_size, input_size, dtype=dtype), requires_grad=False
            )
            self.weight.weight_loader = self.weight_loader
            self.gemm = ops.gemm
        else:
            self.quant_method.create_weights(self)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def shard_plan(self, shard_id: object) -> ShardPlan | None:
        """This rank's part of the weight `shard_id` of the checkpoint; None: all of it."""
        return None

    def checkpoint_parts(
        self, loaded_weight: torch.Tensor, shard_id: object, block: int = 1
    ) -> list[tuple[object, torch.Tensor]]:
        """The (shard_id, tensor) parts a checkpoint tensor loads as, each by its own
        shard_plan: the tensor itself here. block: rows of the weight per row of the tensor
        (an FP8 scale's 128)."""
        return [(shard_id, loaded_weight)]

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        for part_id, part in self.checkpoint_parts(loaded_weight, shard_id):
            plan = self.shard_plan(part_id)
            if param.dim() == 1 and plan is not None and plan.dim == 1:
                plan = None  # a row-parallel bias is not split
            load_shard(param, part, plan)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.quant_method is None:
            return self.gemm(x, self.weight, bias)
        return self.quant_method.apply(self, x, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x, self.bias)


class ReplicatedLinear(LinearBase):
    """The full weight on every rank."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__(input_size, output_size, bias, dtype, ops)


class ColumnParallelLinear(LinearBase):
    """Splits the output dim: rank r holds rows [r * n, (r + 1) * n) of W and b."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        _, tp_size = ops.tp or get_tp_rank_size()
        out_size = divide(output_size, tp_size, "output size")
        super().__init__(input_size, out_size, bias, dtype, ops)

    def shard_plan(self, shard_id: object) -> ShardPlan | None:
        size = self.output_size
        return ShardPlan(0, self.tp_rank, size, size * self.tp_size)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate_up); shard_id indexes output_sizes.
    A checkpoint tensor loaded with shard_id None stacks them all (Qwen3.5's in_proj_qkv: q,
    k, v rows): each part is split over the ranks, as if loaded alone."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        dtype: torch.dtype | None = None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        _, tp_size = ops.tp or get_tp_rank_size()
        self.shard_sizes = [divide(n, tp_size, "merged output size") for n in output_sizes]
        super().__init__(input_size, sum(output_sizes), bias, dtype, ops)

    def shard_plan(self, shard_id: object) -> ShardPlan | None:
        if shard_id is None and self.tp_size == 1:
            return None  # every part, stacked, as the weight holds them
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.shard_sizes):
            raise ValueError(f"merged linear needs shard_id in 0..{len(self.shard_sizes) - 1}")
        size = self.shard_sizes[shard_id]
        offset = sum(self.shard_sizes[:shard_id])
        return ShardPlan(0, self.tp_rank, size, size * self.tp_size, offset)

    def checkpoint_parts(
        self, loaded_weight: torch.Tensor, shard_id: object, block: int = 1
    ) -> list[tuple[object, torch.Tensor]]:
        if shard_id is not None or self.tp_size == 1:
            return [(shard_id, loaded_weight)]
        full_sizes = [n * self.tp_size for n in self.shard_sizes]
        if any(n % block for n in full_sizes):
            raise ValueError(
                f"parts of {full_sizes} rows stacked in one tensor do not fall on its "
                f"{block}-row blocks"
            )
        parts = split_stacked(loaded_weight, [n // block for n in full_sizes])
        return list(enumerate(parts))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul, split by heads.

    With fewer KV heads than ranks, each rank holds one KV head, replicated over
    tp_size // total_num_kv_heads ranks.
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        tp_rank, tp_size = ops.tp or get_tp_rank_size()
        self.head_dim = head_dim
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size, "number of attention heads")
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, "number of KV heads")
            num_kv_replicas = 1
        else:
            if tp_size % total_num_kv_heads != 0:
                raise ValueError(
                    f"tensor_parallel_size ({tp_size}) must be a multiple of the number of "
                    f"KV heads ({total_num_kv_heads}) when it exceeds it"
                )
            self.num_kv_heads = 1
            num_kv_replicas = tp_size // total_num_kv_heads
        self.kv_rank = tp_rank // num_kv_replicas
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        # Skips ColumnParallelLinear.__init__: the per-rank size here is by heads, not output / tp.
        LinearBase.__init__(self, hidden_size, output_size, bias, dtype, ops)

    def shard_plan(self, shard_id: object) -> ShardPlan | None:
        if shard_id == "q":
            offset, size, index = 0, self.q_size, self.tp_rank
            full_size = self.total_num_heads * self.head_dim
        elif shard_id in ("k", "v"):
            offset = self.q_size if shard_id == "k" else self.q_size + self.kv_size
            size, index = self.kv_size, self.kv_rank
            full_size = self.total_num_kv_heads * self.head_dim
        else:
            raise ValueError(f"qkv linear needs shard_id 'q', 'k' or 'v', got {shard_id!r}")
        return ShardPlan(0, index, size, full_size, offset)


class RowParallelLinear(LinearBase):
    """Splits the input dim; partial products are summed with an all-reduce."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        _, tp_size = ops.tp or get_tp_rank_size()
        in_size = divide(input_size, tp_size, "input size")
        super().__init__(in_size, output_size, bias, dtype, ops)
        self.reduce = ops.row_reduce

    def shard_plan(self, shard_id: object) -> ShardPlan | None:
        size = self.input_size
        return ShardPlan(1, self.tp_rank, size, size * self.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [num_tokens, input_size // tp_size]. Only rank 0 adds the bias, so that the
        # all-reduce adds it once.
        bias = self.bias if self.tp_rank == 0 else None
        return self.reduce(self.linear(x, bias), self.tp_size)
