"""The tensor-parallel all-reduce: a one-shot (or two-shot) sum through symmetric memory,
buffers that every GPU of the node maps over NVLink (torch.ops.symm_mem, no multicast), for
decode-sized messages; NCCL (torch.distributed) above a size threshold and on the CPU.

The kernels barrier with their peers through signal pads in device memory, so they run
inside CUDA graphs. The one-shot kernel adds the ranks' inputs in rank order on every rank:
every rank gets the same bits, and at two ranks the same bits as NCCL (a + b = b + a).
"""

from __future__ import annotations

import logging
import socket
import warnings
from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist

from minivllm.distributed.parallel_state import all_reduce, all_reduce_ordered

logger = logging.getLogger(__name__)

Method = Literal["one_shot", "two_shot", "fallback"]
Reduce = Callable[[torch.Tensor, int], torch.Tensor]

# Per world size: (method, largest message in bytes it takes), tried in order; larger
# messages go to the fallback (NCCL). At two ranks one-shot and two-shot move the same bytes
# and one-shot needs one barrier less. benchmarks/kernels/bench_allreduce.py measures these.
PLANS: dict[int, tuple[tuple[Method, int], ...]] = {
    2: (("one_shot", 8 << 20),),
    4: (("one_shot", 512 << 10), ("two_shot", 8 << 20)),
    8: (("one_shot", 256 << 10), ("two_shot", 8 << 20)),
}
BUFFER_BYTES = 8 << 20
# torch numbers the store keys of its symmetric-memory rendezvous with a counter per process,
# so a process that has set up a buffer before (an earlier TP LLM in rank 0's process) cannot
# rendezvous with fresh workers: their counters differ and both would wait on keys the other
# never writes. A process-wide fact, hence process-wide state: how many set-ups happened here.
_SETUPS_IN_THIS_PROCESS = [0]
_DTYPES = (torch.bfloat16, torch.float32)  # what the symm_mem kernels are built for
_ALIGN = 16  # bytes: the kernels' vector width, for the staged input and its size


def _ops():
    return torch.ops.symm_mem


def _has_op(name: str) -> bool:
    try:
        return hasattr(_ops(), name)
    except Exception:
        return False


def symm_mem_unavailable(device: torch.device) -> str | None:
    """Why this process cannot use the symmetric-memory all-reduce, or None if it can."""
    if device.type != "cuda":
        return "not a CUDA device"
    if not (dist.is_initialized() and dist.get_backend() == "nccl"):
        return "no NCCL process group"
    if dist.get_world_size() not in PLANS:
        return f"world size {dist.get_world_size()} has no plan"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        return "torch.distributed._symmetric_memory is missing"
    if not (_has_op("one_shot_all_reduce_out") and _has_op("two_shot_all_reduce_")):
        return "torch.ops.symm_mem lacks one_shot_all_reduce_out / two_shot_all_reduce_"
    index = device.index if device.index is not None else torch.cuda.current_device()
    for peer in range(torch.cuda.device_count()):
        if peer != index and not torch.cuda.can_device_access_peer(index, peer):
            return f"GPU {index} cannot access GPU {peer} (no P2P)"
    return None


class SymmBuffer:
    """A byte buffer in symmetric memory, mapped on every rank of the default group, and the
    all-reduce kernels that stage their input in it. Collective to create."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD
        self.group_name = group.group_name
        self.world_size = dist.get_world_size()
        self.nbytes = nbytes
        self.buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        try:
            self.handle = symm_mem.rendezvous(self.buffer, self.group_name)
        except RuntimeError:
            # Older torch (before the groups registered themselves) needs this call first.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(self.group_name)
            self.handle = symm_mem.rendezvous(self.buffer, self.group_name)
        self._copy_in = _has_op("one_shot_all_reduce_copy_out")
        self._two_shot_out = _has_op("two_shot_all_reduce_out")

    def fits(self, x: torch.Tensor) -> bool:
        return x.is_cuda and message_fits(x, self.nbytes)

    def _staged(self, x: torch.Tensor) -> torch.Tensor:
        return self.buffer[: x.numel() * x.element_size()].view(x.dtype)

    def one_shot(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank reads every peer's whole input and adds them in rank order."""
        flat, staged = x.view(-1), self._staged(x)
        out = torch.empty_like(flat)
        if self._copy_in:  # the kernel stages the input itself: one launch
            _ops().one_shot_all_reduce_copy_out(staged, flat, "sum", self.group_name, out)
        else:
            staged.copy_(flat)
            _ops().one_shot_all_reduce_out(staged, "sum", self.group_name, out)
        return out.view(x.shape)

    def two_shot(self, x: torch.Tensor) -> torch.Tensor:
        """Reduce-scatter (each rank sums its 1/N in rank order), then all-gather."""
        flat, staged = x.view(-1), self._staged(x)
        staged.copy_(flat)
        if self._two_shot_out:
            out = torch.empty_like(flat)
            _ops().two_shot_all_reduce_out(staged, "sum", self.group_name, out)
            return out.view(x.shape)
        _ops().two_shot_all_reduce_(staged, "sum", self.group_name)
        return staged.clone().view(x.shape)


def message_fits(x: torch.Tensor, max_bytes: int) -> bool:
    """Whether the kernels take x: a contiguous bf16/fp32 tensor of at most max_bytes, 16-byte
    aligned in size and offset."""
    nbytes = x.numel() * x.element_size()
    return (
        x.dtype in _DTYPES
        and 0 < nbytes <= max_bytes
        and nbytes % _ALIGN == 0
        and (x.storage_offset() * x.element_size()) % _ALIGN == 0
        and x.is_contiguous()
    )


def pick_method(world_size: int, nbytes: int) -> Method:
    for method, limit in PLANS.get(world_size, ()):
        if nbytes <= limit:
            return method
    return "fallback"


class TPAllReduce:
    """Callable like parallel_state.all_reduce, `(x, tp_size) -> sum over ranks`:
    symmetric memory where it fits, `fallback` otherwise. Every rank picks the same method
    (it depends on the shape and dtype only), as the kernels' barriers need."""

    def __init__(self, symm: SymmBuffer, fallback: Reduce) -> None:
        self.symm = symm
        self.fallback = fallback

    def __call__(self, x: torch.Tensor, tp_size: int) -> torch.Tensor:
        if tp_size > 1 and self.symm.fits(x):
            method = pick_method(tp_size, x.numel() * x.element_size())
            if method == "one_shot":
                return self.symm.one_shot(x)
            if method == "two_shot":
                return self.symm.two_shot(x)
        return self.fallback(x, tp_size)


def create_symm_buffer(device: torch.device, nbytes: int = BUFFER_BYTES) -> SymmBuffer | None:
    """Collective over the default group: a SymmBuffer on every rank, checked against NCCL
    once, or None on every rank (with the reason logged) when any rank cannot have one."""
    if device.type != "cuda":  # the same on every rank: no collective needed to agree
        return None
    # Symmetric memory maps peers' GPU memory over NVLink: one host only (collective).
    reason = None if _on_one_host() else "the ranks span more than one host"
    reason = reason or symm_mem_unavailable(device)
    if reason is None and _SETUPS_IN_THIS_PROCESS[0]:
        reason = "set up before in this process (torch's rendezvous counters would differ)"
    if not _all_ranks_ok(reason is None, device):
        logger.info("tensor-parallel all-reduce: NCCL only (%s)", reason or "a peer said no")
        return None
    symm, error = None, None
    _SETUPS_IN_THIS_PROCESS[0] += 1
    try:
        symm = SymmBuffer(nbytes, device)
        error = _self_test(symm, device)
    except Exception as e:  # a driver or container without the IPC it needs
        error = f"{type(e).__name__}: {e}"
    if not _all_ranks_ok(error is None, device):
        logger.warning("tensor-parallel all-reduce: NCCL only (%s)", error or "a peer failed")
        return None
    logger.info(
        "tensor-parallel all-reduce: symmetric memory up to %d bytes, plan %s",
        nbytes,
        PLANS[symm.world_size],
    )
    return symm


def _on_one_host() -> bool:
    """Whether every rank of the default group runs on this host (collective)."""
    hosts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return len(set(hosts)) == 1


def _all_ranks_ok(ok: bool, device: torch.device) -> bool:
    flag = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _self_test(symm: SymmBuffer, device: torch.device) -> str | None:
    """One call of each kernel against NCCL on rank-dependent data; a mismatch message."""
    rank = dist.get_rank()
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    x = torch.randn(64, 1024, generator=gen, device=device).to(torch.bfloat16)
    expected = x.clone()
    dist.all_reduce(expected)
    for name, got in (("one_shot", symm.one_shot(x)), ("two_shot", symm.two_shot(x))):
        if symm.world_size == 2 and not torch.equal(got, expected):
            return f"{name} differs from NCCL"
        if not torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2):
            return f"{name} differs from NCCL"
    return None


def tp_all_reduce(symm: SymmBuffer | None, ordered: bool) -> Reduce:
    """The all-reduce of this rank's layers: NCCL's, or the rank-ordered float32 sum when
    `ordered` (deterministic mode), behind TPAllReduce when there is a buffer. The ordered
    sum goes through it only at two ranks, where one-shot gives its bits exactly (one rounding
    of x0 + x1); beyond two the one-shot adds in bf16 step by step, not in float32."""
    fallback = all_reduce_ordered if ordered else all_reduce
    if symm is None or (ordered and symm.world_size != 2):
        return fallback
    return TPAllReduce(symm, fallback=fallback)
