"""The TP all-reduce's dispatch (CPU): which messages take the symmetric-memory kernels, which
fall back, which layers get it. The kernels themselves run in tests/gpu/test_gpu_tp.py."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.all_reduce import (
    PLANS,
    TPAllReduce,
    bind_all_reduce,
    create_symm_buffer,
    message_fits,
    pick_method,
)
from minivllm.distributed.parallel_state import all_reduce
from minivllm.layers.batch_invariant import all_reduce_ordered
from minivllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.linear import RowParallelLinear


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


def test_bind_replaces_nccl_reduces_and_ordered_only_at_two_ranks() -> None:
    def model() -> nn.Module:
        m = nn.ModuleList(
            [
                RowParallelLinear(16, 16),
                RowParallelLinear(16, 16),
                VocabParallelEmbedding(128, 16),
                ParallelLMHead(128, 16),
                nn.Linear(4, 4),
            ]
        )
        m[1].reduce = all_reduce_ordered  # deterministic mode's sum
        return m

    at_two = model()
    assert bind_all_reduce(at_two, FakeSymm(world_size=2)) == 4  # 2 row, embedding, head
    assert all(isinstance(m.reduce, TPAllReduce) for m in at_two[:4])
    assert at_two[0].reduce.fallback is all_reduce
    assert at_two[1].reduce.fallback is all_reduce_ordered
    at_four = model()
    assert bind_all_reduce(at_four, FakeSymm(world_size=4)) == 3
    assert at_four[1].reduce is all_reduce_ordered  # bf16 step sums are not its bits
