"""all_reduce_ordered over 3 gloo ranks: every rank gets ((x0 + x1) + x2) in float32, rounded
once, the same bits on each rank."""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minivllm.distributed.parallel_state import all_reduce_ordered

WORLD = 3


def _part(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rank)
    # Magnitudes far apart, so that another summation order would round differently.
    return (torch.randn(5, 7, generator=gen) * 10.0 ** (2 * rank)).to(torch.bfloat16)


def _worker(rank: int, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(out_dir, 'rendezvous')}",  # no port to race for
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        torch.save(all_reduce_ordered(_part(rank), WORLD), os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ordered_sum_same_bits_on_every_rank(tmp_path) -> None:
    # spawn, not fork: a fork of a pytest worker that has run other tests can inherit held
    # locks and hang; a deadline turns any hang into a failure.
    ranks = mp.start_processes(
        _worker, (str(tmp_path),), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=1.0):
        if time.monotonic() > deadline:
            for proc in ranks.processes:
                proc.kill()
            raise AssertionError("the ranks did not finish within 120 s")
    expected = ((_part(0).float() + _part(1).float()) + _part(2).float()).to(torch.bfloat16)
    for rank in range(WORLD):
        assert torch.equal(torch.load(tmp_path / f"{rank}.pt"), expected), f"rank {rank}"


def test_single_rank_is_identity() -> None:
    x = torch.randn(3, 4)
    assert all_reduce_ordered(x, 1) is x
