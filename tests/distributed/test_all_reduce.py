"""The TP all-reduce's dispatch (CPU): which messages take the symmetric-memory kernels, which
fall back, which layers get it (layers/ops.py). The kernels themselves run in
tests/gpu/test_gpu_tp.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.all_reduce import (
    PLANS,
    TPAllReduce,
    create_symm_buffer,
    message_fits,
    pick_method,
    tp_all_reduce,
)
from minivllm.distributed.parallel_state import all_reduce, all_reduce_ordered
from minivllm.kernels.matmul import matmul
from minivllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.linear import RowParallelLinear
from minivllm.layers.ops import LayerOps, layer_ops


class FakeSymm:
    """Records which kernel ran; fits() is the real rule minus the device check."""

    def __init__(self, world_size: int = 2, nbytes: int = 8 << 20) -> None:
        self.world_size, self.nbytes, self.calls = world_size, nbytes, []

    def fits(self, x: torch.Tensor) -> bool:
        return message_fits(x, self.nbytes)

    def one_shot(self, x):
        self.calls.append("one_shot")
        return x * 2

    def two_shot(self, x):
        self.calls.append("two_shot")
        return x * 3


def test_plans_cover_decode_messages() -> None:
    # A decode step of 256 rows x hidden 4096 in bf16 (2 MB) takes a kernel at 2, 4, 8 ranks;
    # a 64 MB prefill chunk goes to NCCL.
    for world in PLANS:
        assert pick_method(world, 256 * 4096 * 2) != "fallback"
        assert pick_method(world, 64 << 20) == "fallback"
    assert pick_method(2, 8 << 20) == "one_shot"
    assert pick_method(4, 256 << 10) == "one_shot"
    assert pick_method(4, 4 << 20) == "two_shot"
    assert pick_method(3, 1024) == "fallback"  # no plan: NCCL


def test_dispatch_and_fallback() -> None:
    symm = FakeSymm(world_size=4)
    fallback_calls = []

    def fallback(x, tp_size):
        fallback_calls.append(x.shape)
        return x

    reduce = TPAllReduce(symm, fallback)
    small = torch.ones(8, 64, dtype=torch.bfloat16)
    assert torch.equal(reduce(small, 4), small * 2) and symm.calls == ["one_shot"]
    mid = torch.ones(1024, 1024, dtype=torch.bfloat16)  # 2 MB at 4 ranks: two-shot
    assert torch.equal(reduce(mid, 4), mid * 3) and symm.calls[-1] == "two_shot"
    for x in (
        torch.ones(3000, 2048, dtype=torch.float32),  # above the buffer
        torch.ones(8, 64, dtype=torch.float16),  # no fp16 kernel
        torch.ones(8, 3, dtype=torch.bfloat16),  # 48 bytes: fine; 6 bytes below is not
        torch.ones(3, dtype=torch.bfloat16),
        torch.ones(8, 64, dtype=torch.bfloat16)[:, :32],  # not contiguous
    ):
        before = len(symm.calls)
        reduce(x, 4)
        assert len(symm.calls) == before + (x.shape == (8, 3))
    assert len(fallback_calls) == 4
    assert reduce(small, 1) is small  # one rank: nothing to sum, the fallback's no-op


def test_create_symm_buffer_is_none_on_cpu_without_collectives() -> None:
    # No process group exists here: a collective would raise.
    assert create_symm_buffer(torch.device("cpu")) is None


def test_ops_take_symm_for_nccl_reduces_and_ordered_only_at_two_ranks() -> None:
    def model(world_size: int) -> nn.Module:
        ops = layer_ops(deterministic=False, symm=FakeSymm(world_size))
        ordered = layer_ops(deterministic=True, symm=FakeSymm(world_size))
        return nn.ModuleList(
            [
                RowParallelLinear(16, 16, ops=ops),
                RowParallelLinear(16, 16, ops=ordered),  # deterministic mode's sum
                VocabParallelEmbedding(128, 16, ops=ops),
                ParallelLMHead(128, 16, ops=ops),
                nn.Linear(4, 4),
            ]
        )

    at_two = model(2)
    assert all(isinstance(m.reduce, TPAllReduce) for m in at_two[:4])  # 2 row, embedding, head
    assert at_two[0].reduce.fallback is all_reduce
    assert at_two[1].reduce.fallback is all_reduce_ordered
    at_four = model(4)
    assert all(isinstance(m.reduce, TPAllReduce) for m in (at_four[0], *at_four[2:4]))
    assert at_four[1].reduce is all_reduce_ordered  # bf16 step sums are not its bits
    assert tp_all_reduce(None, ordered=False) is all_reduce  # no buffer: NCCL
    assert tp_all_reduce(None, ordered=True) is all_reduce_ordered
    assert LayerOps().row_reduce is all_reduce and LayerOps().reduce is all_reduce


def test_deterministic_ops_are_batch_invariant() -> None:
    ops = layer_ops(deterministic=True, symm=FakeSymm(world_size=2))
    assert ops.gemm is matmul
    assert isinstance(ops.row_reduce, TPAllReduce) and ops.row_reduce.fallback is all_reduce_ordered
    assert RowParallelLinear(16, 16, ops=ops).gemm is matmul
    assert ParallelLMHead(128, 16, ops=ops).gemm is matmul
    assert layer_ops(deterministic=True).row_reduce is all_reduce_ordered
    assert layer_ops(deterministic=False).gemm is F.linear
