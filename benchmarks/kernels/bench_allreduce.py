"""All-reduce latency on N GPUs of one node: NCCL against the symmetric-memory one-shot and
two-shot kernels (minivllm/distributed/all_reduce.py) and the engine's choice among them
("auto"), eagerly and replayed from a CUDA graph, for 256 KB .. 64 MB messages. Prints one
JSON line per (size, method, mode); every method's result is checked against NCCL's (bitwise
at two ranks: a + b = b + a).

python -m benchmarks.kernels.bench_allreduce [--world-size 2] [--dtype bfloat16]
torchrun --nproc-per-node 2 -m benchmarks.kernels.bench_allreduce
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import time

import torch
import torch.distributed as dist

from minivllm.distributed.all_reduce import (
    PLANS,
    TPAllReduce,
    create_symm_buffer,
    symm_mem_unavailable,
)

SIZES = [(256 << 10) << i for i in range(9)]  # 256 KB .. 64 MB
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _nccl(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    dist.all_reduce(x)  # in place, as the engine's layers use it
    return x


def _methods(symm) -> dict:
    methods = {"nccl": _nccl}
    if symm is not None:
        methods["one_shot"] = lambda x, n: symm.one_shot(x)
        methods["two_shot"] = lambda x, n: symm.two_shot(x)
        methods["auto"] = TPAllReduce(symm, fallback=_nccl)
    return methods


def _time_eager(fn, x: torch.Tensor, world: int, iters: int) -> float:
    for _ in range(5):
        fn(x, world)
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn(x, world)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def _time_graph(fn, x: torch.Tensor, world: int, iters: int, calls: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as capture wants
        fn(x, world)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(x, world)
    graph.replay()
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (iters * calls) * 1e6


def _matches_nccl(fn, x: torch.Tensor, world: int) -> bool:
    expected = x.clone()
    dist.all_reduce(expected)
    got = fn(x.clone(), world)
    if world == 2:
        return torch.equal(got, expected)
    return torch.allclose(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


def run_rank(rank: int, local_rank: int, world: int, init_method: str, args) -> None:
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
        device_id=device,
    )
    dtype = DTYPES[args.dtype]
    reason = symm_mem_unavailable(device)
    symm = create_symm_buffer(device, nbytes=max(SIZES))
    if rank == 0 and symm is None:
        print(json.dumps({"bench": "allreduce", "symm_mem": "unavailable", "why": reason}))
    gen = torch.Generator(device=device).manual_seed(rank)
    for nbytes in SIZES:
        numel = nbytes // torch.empty(0, dtype=dtype).element_size()
        x = torch.randn(numel, generator=gen, device=device).to(dtype).view(-1, 4096)
        for name, fn in _methods(symm).items():
            equal = _matches_nccl(fn, x, world)
            scratch = x.clone()
            results = {
                "eager": _time_eager(fn, scratch, world, args.iters),
                "graph": _time_graph(fn, scratch, world, args.iters, args.calls),
            }
            for mode, us in results.items():
                if rank == 0:
                    line = {
                        "bench": "allreduce",
                        "world_size": world,
                        "dtype": args.dtype,
                        "bytes": nbytes,
                        "method": name,
                        "mode": mode,
                        "us": round(us, 2),
                        "busbw_GBps": round(nbytes * 2 * (world - 1) / world / us / 1e3, 1),
                        "equal_nccl": equal,
                        "plan": PLANS.get(world),
                        "torch": torch.__version__,
                    }
                    print(json.dumps(line), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank: int, world: int, init_method: str, args) -> None:
    run_rank(rank, rank, world, init_method, args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--calls", type=int, default=10, help="all-reduces per graph")
    args = parser.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        env = os.environ
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        run_rank(rank, int(env.get("LOCAL_RANK", rank)), world, "env://", args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_spawned, args=(r, args.world_size, init_method, args))
        for r in range(args.world_size)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    if any(proc.exitcode != 0 for proc in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")


if __name__ == "__main__":
    main()
