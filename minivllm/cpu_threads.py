"""torch's CPU thread counts, chosen from the cores this process may use (its affinity and its
cgroup's CPU quota) unless the user set OMP_NUM_THREADS. torch's default (one intra-op thread
per core the machine has, and as many inter-op threads) oversubscribes a small or shared box:
OpenMP threads wait at each op's barrier for a thread that another process holds off its core.
On a 2-core box with one other busy process, 32 tokens of the demo model took 6.5-17 s with
two threads and 1.9-4.1 s with one (benchmarks/cpu/bench_cpu_threads.py)."""

from __future__ import annotations

import math
import os

import torch

USER_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores or 1, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores or 1)


def engine_threads(cores: int) -> int:
    """Intra-op threads of an engine on `cores`: all but one, which the frontend, the tokenizer
    and the grammar threads need (on 2 cores: one thread, as fast alone and far faster when
    the other core is busy)."""
    return max(1, cores - 1)


def set_torch_threads(role: str) -> tuple[int, int] | None:
    """Sets torch's intra-op and inter-op thread counts for a process of this role, "engine"
    (a CPU engine: engine_threads(usable_cores())) or "frontend" (the server's HTTP process:
    1); returns them, or None where the user chose (OMP_NUM_THREADS or MKL_NUM_THREADS set),
    which torch reads itself."""
    if any(name in os.environ for name in USER_VARIABLES):
        return None
    intra = engine_threads(usable_cores()) if role == "engine" else 1
    torch.set_num_threads(intra)
    try:  # the engine issues its ops one at a time: one inter-op thread
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already ran in this process
        pass
    return intra, torch.get_num_interop_threads()
