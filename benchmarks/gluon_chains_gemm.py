"""A candidate for `probe_down_chains.py --gluon`: y = x @ w.T on Hopper in Triton's Gluon, with K
summed as CHAINS in-register chains (as the probe's Triton kernel sums it), at large M.

A program computes [128, BLOCK_N] output tiles (one, or, persistent, one SM's share in
turn), in three partitions (`gl.warp_specialize`): a producer warp TMA-loads, step by step, the
[128, BLOCK_K] box of x and the [BLOCK_N, BLOCK_K] box of w into a ring of NUM_STAGES stages,
the chains' steps interleaved (step s of chain c reads K at c * K_SEG + s * BLOCK_K), and runs
on into the next tile's steps; two consumer warpgroups (64 rows each, both on the same w box)
issue an asynchronous wgmma per step into the chain's accumulator, keep one in flight, and free
a stage once the wgmma that read it has retired. At a tile's end each warpgroup adds its chains
in order ((acc0 + acc1), as the Triton kernel does) and stores its rows.

Written against triton 3.6's Gluon (`triton.experimental.gluon`), after
`minivllm/kernels/gluon_prefill_attention.py`; compiled for sm_90a without a GPU, never run
on one yet: run it under `timeout` (a wrong barrier phase hangs, it does not fail).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Gluon's Hopper API as the engine's Gluon attention kernel imports it (None: unavailable).
from minivllm.kernels.gluon_prefill_attention import (
    GLUON_IMPORT_ERROR,
    _jit,
    _shared_layout,
    wgmma_layout,
)
from minivllm.kernels.matmul import GROUP_M, tile_origin  # the Triton GEMM's tile order

if GLUON_IMPORT_ERROR is None:
    from minivllm.kernels.gluon_prefill_attention import (
        TensorDescriptor,
        gl,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

BLOCK_M = 128  # two consumer warpgroups of 64 rows (wgmma's M)
# Registers per thread of the two workers (the second consumer, the producer's warpgroup);
# the default partition (the first consumer) gets what they leave.
_CONSUMER_REGS = tl.constexpr(232)
_PRODUCER_REGS = tl.constexpr(40)
# What the kernel reads (jit functions see module globals only as constexprs).
_BLOCK_M = tl.constexpr(BLOCK_M)
_WG_ROWS = tl.constexpr(BLOCK_M // 2)
_GROUP_M = tl.constexpr(GROUP_M)


@_jit
def _producer(x_desc, w_desc, a_bufs, b_bufs, ready, empty, M, N, k_seg, num_tiles,
              CHAINS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              NUM_STAGES: gl.constexpr):  # fmt: skip
    """For each of the program's tiles, fills stage g % NUM_STAGES with step g of the program's
    step sequence (the tile's chains interleaved) once both consumers freed it; a fresh
    barrier passes a wait on phase 1, so the first lap does not wait."""
    steps = k_seg // BLOCK_K * CHAINS
    g = 0
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = tile_origin(t, M, N, _BLOCK_M, BLOCK_N, _GROUP_M)
        for i in range(steps):
            k = (i % CHAINS) * k_seg + (i // CHAINS) * BLOCK_K
            stage = g % NUM_STAGES
            mbarrier.wait(empty.index(stage), ((g // NUM_STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [off_m, k], bar, a_bufs.index(stage))
            tma.async_copy_global_to_shared(w_desc, [off_n, k], bar, b_bufs.index(stage))
            g += 1


@_jit
def _consumer(WG: gl.constexpr, a_bufs, b_bufs, ready, empty, y_ptr, M, N, stride_ym, k_seg,
              num_tiles, CHAINS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              NUM_STAGES: gl.constexpr):  # fmt: skip
    """Rows WG * 64 .. WG * 64 + 63 of each of the program's tiles: a wgmma per step into its
    chain's accumulator, one in flight, a stage freed once the wgmma that read it retired; then
    acc0 (+ acc1) stored in y's dtype while the producer already fills the next tile's
    stages."""
    layout: gl.constexpr = wgmma_layout(BLOCK_N)
    zero = gl.zeros([_WG_ROWS, BLOCK_N], gl.float32, layout=layout)
    g = 0
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        acc0 = zero
        acc1 = zero
        for s in range(k_seg // BLOCK_K):
            for c in gl.static_range(CHAINS):
                stage = g % NUM_STAGES
                mbarrier.wait(ready.index(stage), (g // NUM_STAGES) & 1)
                a = a_bufs.index(stage).slice(WG * _WG_ROWS, _WG_ROWS)
                b = b_bufs.index(stage).permute((1, 0))
                if c == 0:
                    acc0 = warpgroup_mma(a, b, acc0, is_async=True)
                else:
                    acc1 = warpgroup_mma(a, b, acc1, is_async=True)
                # wgmma groups retire in order: one outstanding means the previous step's
                # (of this tile) has retired.
                acc0, acc1 = warpgroup_mma_wait(1, deps=[acc0, acc1])
                if s * CHAINS + c > 0:
                    mbarrier.arrive(empty.index((g - 1) % NUM_STAGES))
                g += 1
        acc0, acc1 = warpgroup_mma_wait(0, deps=[acc0, acc1])
        mbarrier.arrive(empty.index((g - 1) % NUM_STAGES))  # the tile's last step
        acc = acc0
        if CHAINS == 2:
            acc = acc0 + acc1
        off_m, off_n = tile_origin(t, M, N, _BLOCK_M, BLOCK_N, _GROUP_M)
        rows = off_m + WG * _WG_ROWS + gl.arange(0, _WG_ROWS, layout=gl.SliceLayout(1, layout))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        dst = y_ptr + rows.to(gl.int64)[:, None] * stride_ym + cols[None, :]
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        gl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=mask)


@_jit
def _gluon_chains_kernel(x_desc, w_desc, y_ptr, M, N, k_seg, stride_ym,
                         CHAINS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                         NUM_STAGES: gl.constexpr):  # fmt: skip
    """Grid (programs,): program p computes output tiles p, p + programs, ... of the
    cdiv(M, 128) * cdiv(N, BLOCK_N) (one each when programs is their number; persistent when
    it is the SM count)."""
    num_tiles = gl.cdiv(M, _BLOCK_M) * gl.cdiv(N, BLOCK_N)
    dtype: gl.constexpr = x_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES, _BLOCK_M, BLOCK_K], x_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)  # the producer's expect; TMA bytes complete it
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    gl.warp_specialize(
        [
            (_consumer, (0, a_bufs, b_bufs, ready, empty, y_ptr, M, N, stride_ym, k_seg,
                         num_tiles, CHAINS, BLOCK_N, BLOCK_K, NUM_STAGES)),
            (_consumer, (1, a_bufs, b_bufs, ready, empty, y_ptr, M, N, stride_ym, k_seg,
                         num_tiles, CHAINS, BLOCK_N, BLOCK_K, NUM_STAGES)),
            (_producer, (x_desc, w_desc, a_bufs, b_bufs, ready, empty, M, N, k_seg, num_tiles,
                         CHAINS, BLOCK_N, BLOCK_K, NUM_STAGES)),
        ],
        [4, 1],
        [_CONSUMER_REGS, _PRODUCER_REGS],
    )  # fmt: skip


def gluon_chains_gemm(
    chains: int,
    block_n: int = 128,
    block_k: int = 64,
    num_stages: int = 4,
    persistent: bool = True,
):
    """F.linear(x, w) (no bias) by `_gluon_chains_kernel`: x [M, K], w [N, K], both K-major
    bf16/fp16, K a multiple of chains * block_k; persistent: a program per SM, else one per
    output tile."""
    if chains not in (1, 2):
        raise ValueError(f"chains must be 1 or 2, got {chains}")

    def gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        (m, k), n = x.shape, w.shape[0]
        if k % (chains * block_k):
            raise ValueError(f"K = {k} is not {chains} segments of whole {block_k}-steps")
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        x_box, w_box = (BLOCK_M, block_k), (block_n, block_k)
        x_desc = TensorDescriptor(
            x, [m, k], [x.stride(0), 1], list(x_box), _shared_layout(x_box, x.dtype)
        )
        w_desc = TensorDescriptor(
            w, [n, k], [w.stride(0), 1], list(w_box), _shared_layout(w_box, w.dtype)
        )
        tiles = triton.cdiv(m, BLOCK_M) * triton.cdiv(n, block_n)
        if persistent:
            tiles = min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count)
        grid = (tiles,)
        _gluon_chains_kernel[grid](
            x_desc, w_desc, y, m, n, k // chains, y.stride(0),
            CHAINS=chains, BLOCK_N=block_n, BLOCK_K=block_k, NUM_STAGES=num_stages, num_warps=4,
        )  # fmt: skip
        return y

    return gemm
