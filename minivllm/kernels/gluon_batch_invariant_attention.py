"""Deterministic mode's prefill attention on Hopper: the bits of the batch-invariant walk
(kernels/batch_invariant_attention.py) at the FA3-style kernel's speed
(kernels/gluon_prefill_attention.py, whose producer warp, ring and ping-pong it shares).

A row's arithmetic is the walk's, operation for operation, so a row computed here equals the
same row computed by the Triton kernel (as a prefill row, or as a decode row, split by segment
or not) bit for bit:

- key tiles of BLOCK_N (the mode's one BLOCK_N per head_dim) at absolute positions; within a
  segment (`SegmentRule`, from the row's own position) an online softmax from a fresh state:
  m_use guards a row that has seen nothing, p = exp2(fma(s, scale, -m_use)), the row sum l by
  an MMA of p against a [BLOCK_N, L_COLS] block of ones (an in-order chain over the keys, like
  acc), acc and l rescaled by alpha before the tile's MMA adds to them;
- at a tile that starts a row's new segment, the finished segment is folded into the row's
  total by `_fold` (explicit FMAs), and the segment state restarts; after the last tile, the
  same closing folds as the walk.

Each consumer warpgroup therefore carries two states, the segment's (in the MMA accumulators)
and the total, which is touched only at a fold. A segment ends where a tile starts at a
multiple of its length, so the fold runs in the next tile's step, after that tile's softmax
and once the last PV product of the segment has landed. Rows past a tile's own positions see
masked keys: exact zeros, as in the walk.
"""

from __future__ import annotations

import torch

from minivllm.kernels import gluon_prefill_attention as fa3
from minivllm.kernels.attention_segments import SEGMENTS, SegmentRule, segment_len
from minivllm.kernels.batch_invariant_configs import batch_invariant_config
from minivllm.kernels.checks import LOG2E, check_kv_scales
from minivllm.kernels.gluon_prefill_attention import (
    _CONSUMER_REGS,
    _PRODUCER_REGS,
    _WG_ROWS,
    BATCH_ARGS,
    BLOCK_M,
    GLUON_IMPORT_ERROR,
    SHARED_MEMORY_LIMIT,
    _allocate_ring,
    _first_scores,
    _jit,
    _pass_turn,
    _producer,
    _program,
    _store_rows,
    _take_turn,
    _tile_keys,
    _tile_rows,
    wgmma_layout,
)

if GLUON_IMPORT_ERROR is None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

L_COLS = 16  # columns of the row-sum MMA, as the Triton walk's
_L_COLS = gl.constexpr(L_COLS) if GLUON_IMPORT_ERROR is None else L_COLS
# head_dim -> ring stages of BLOCK_N-key K and V tiles (BLOCK_N is the mode's, per head_dim).
_STAGES = {64: 3, 128: 2}


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether this kernel runs these tensors: those of `gluon_prefill_attention.supports` whose
    head_dim has a ring here and the mode's BLOCK_N for it is a tile this kernel takes."""
    if not fa3.supports(q, kv_cache) or q.shape[2] not in _STAGES:
        return False
    return batch_invariant_config(q.shape[2], q.element_size())[1] in (64, 128)


@_jit
def _softmax(s, m_i, scale_log2e, q_pos, n0, kv_end, MASKED: gl.constexpr):
    """The walk's `_tile_update` up to the MMAs: p (fp32), the new m and alpha."""
    if MASKED:
        pos = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        visible = (pos[None, :] <= q_pos[:, None]) & (pos < kv_end)[None, :]
        s = gl.where(visible, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2e)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(gl.fma(s, scale_log2e, -m_use[:, None]))
    alpha = gl.exp2(m_i - m_use)
    return p, m_new, alpha


@_jit
def _fold_ended(tot_acc, tot_m, tot_l, acc, m_i, l_i, ended):
    """The walk's `_fold_ended`: rows with `ended` fold their segment (acc, m_i, l_i) into
    their total; the others keep the total bit for bit. Returns the total only: the caller
    restarts the ended rows' segment state."""
    m_new = gl.maximum(tot_m, m_i)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    a = gl.exp2(tot_m - m_use)
    b = gl.exp2(m_i - m_use)
    a_o = gl.convert_layout(a, gl.SliceLayout(1, tot_acc.type.layout))[:, None]
    b_o = gl.convert_layout(b, gl.SliceLayout(1, tot_acc.type.layout))[:, None]
    a_l = gl.convert_layout(a, gl.SliceLayout(1, tot_l.type.layout))[:, None]
    b_l = gl.convert_layout(b, gl.SliceLayout(1, tot_l.type.layout))[:, None]
    ended_o = gl.convert_layout(ended, gl.SliceLayout(1, tot_acc.type.layout))[:, None]
    ended_l = gl.convert_layout(ended, gl.SliceLayout(1, tot_l.type.layout))[:, None]
    tot_acc = gl.where(ended_o, gl.fma(tot_acc, a_o, acc * b_o), tot_acc)
    tot_l = gl.where(ended_l, gl.fma(tot_l, a_l, l_i * b_l), tot_l)
    tot_m = gl.where(ended, m_new, tot_m)
    return tot_acc, tot_m, tot_l


@_jit
def _restart(acc, m_i, l_i, ended):
    """Fresh segment state (acc = 0, m = -inf, l = 0) for the rows with `ended`."""
    ended_o = gl.convert_layout(ended, gl.SliceLayout(1, acc.type.layout))[:, None]
    ended_l = gl.convert_layout(ended, gl.SliceLayout(1, l_i.type.layout))[:, None]
    acc = gl.where(ended_o, 0.0, acc)
    l_i = gl.where(ended_l, 0.0, l_i)
    m_i = gl.where(ended, float("-inf"), m_i)
    return acc, m_i, l_i


@_jit
def _attend_tiles(WG: gl.constexpr, acc, m_i, l_i, tot, p_op, q, ones, k_bufs, v_bufs, bars,
                  scale_log2e, q_pos, seg_lens, seg_lo, kv_end, lo, hi, BLOCK_N: gl.constexpr,
                  NUM_STAGES: gl.constexpr, MASKED: gl.constexpr,
                  PINGPONG: gl.constexpr):  # fmt: skip
    """Key tiles lo .. hi - 1 (lo >= 1). p_op holds P of tile lo - 1, whose PV and row-sum
    products are still to do; (acc, l_i) are already rescaled for it. Each step issues
    S_j = Q K_j^T, O += P_{j-1} V_{j-1} and l += P_{j-1} 1, does the softmax of S_j (from a
    fresh m for rows whose segment starts at tile j), then, once the products have landed,
    folds the rows whose segment tile j - 1 closed and rescales by alpha_j."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turns = bars
    tot_acc, tot_m, tot_l = tot
    s_layout: gl.constexpr = q_pos.type.layout.parent
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    l_rows: gl.constexpr = gl.SliceLayout(1, l_i.type.layout)
    p_layout: gl.constexpr = p_op.type.layout
    p_l_layout: gl.constexpr = gl.DotOperandLayout(
        operand_index=0, parent=l_i.type.layout, k_width=2
    )
    s_zero = gl.zeros([_WG_ROWS, BLOCK_N], gl.float32, layout=s_layout)
    for j in range(lo, hi):
        stage = j % NUM_STAGES
        prev = (j - 1) % NUM_STAGES
        n0 = j * BLOCK_N
        mbarrier.wait(k_ready.index(stage), (j // NUM_STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
        _take_turn(turns, WG, j, PINGPONG)
        s = warpgroup_mma(q, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)  # fmt: skip
        acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
        l_i = warpgroup_mma(gl.convert_layout(p_op, p_l_layout), ones, l_i, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        s = warpgroup_mma_wait(2, deps=[s])
        mbarrier.arrive(k_empty.index(stage))
        boundary = (n0 & (seg_lo - 1)) == 0  # some row's segment may start here
        ended = ((n0 & (seg_lens - 1)) == 0) & boundary
        seg_m = m_i
        p, m_i, alpha = _softmax(s, gl.where(ended, float("-inf"), m_i), scale_log2e, q_pos,
                                 n0, kv_end, MASKED)  # fmt: skip
        acc, l_i, p_op = warpgroup_mma_wait(0, deps=[acc, l_i, p_op])
        mbarrier.arrive(v_empty.index(prev))
        if boundary:
            tot_acc, tot_m, tot_l = _fold_ended(tot_acc, tot_m, tot_l, acc, seg_m, l_i, ended)
            acc, _, l_i = _restart(acc, seg_m, l_i, ended)
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        l_i = l_i * gl.convert_layout(alpha, l_rows)[:, None]
        p_op = gl.convert_layout(p.to(p_op.dtype), p_layout)
    return acc, m_i, l_i, (tot_acc, tot_m, tot_l), p_op


@_jit
def _consumer(WG: gl.constexpr, bufs, ones, bars, tile, out_ptr, scale_log2e, stride_ot,
              stride_oh, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, SEG_MIN: gl.constexpr,
              SEG_PER_ROW: gl.constexpr, SEG_MAX: gl.constexpr):  # fmt: skip
    """One MMA warpgroup: query rows WG * 64 .. WG * 64 + 63 of the tile, every key tile of
    their context in segments, then the closing folds and the store."""
    q_smem, k_bufs, v_bufs = bufs
    q_bar, k_ready, k_empty, v_ready, v_empty, turns = bars
    q_row, head, t0, query_len, ctx_start, kv_end, full_tiles, num_tiles = tile
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    l_layout: gl.constexpr = wgmma_layout(_L_COLS)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    q = q_smem.slice(WG * _WG_ROWS, _WG_ROWS)
    rows = t0 + WG * _WG_ROWS + gl.arange(0, _WG_ROWS, layout=row_layout)
    q_pos = ctx_start + rows
    # Each row's segment length from its own context; the warpgroup's first row has the
    # shortest, and every longer one is a power-of-two multiple of it.
    seg_lens = segment_len(q_pos + 1, SEG_MIN, SEG_PER_ROW, SEG_MAX)
    seg_lo = segment_len(ctx_start + t0 + WG * _WG_ROWS + 1, SEG_MIN, SEG_PER_ROW, SEG_MAX)
    mbarrier.wait(q_bar, 0)

    s = _first_scores(WG, q, k_bufs, bars, s_layout, BLOCK_N, PINGPONG)
    m_i = gl.full([_WG_ROWS], float("-inf"), gl.float32, layout=row_layout)
    p, m_i, _ = _softmax(s, m_i, scale_log2e, q_pos, 0, kv_end, True)
    p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    # A fresh state's rescale multiplies zeros by alpha = 0: zeros, as these.
    acc = gl.zeros([_WG_ROWS, HEAD_DIM], gl.float32, layout=o_layout)
    l_i = gl.zeros([_WG_ROWS, _L_COLS], gl.float32, layout=l_layout)
    tot = (
        gl.zeros([_WG_ROWS, HEAD_DIM], gl.float32, layout=o_layout),
        gl.full([_WG_ROWS], float("-inf"), gl.float32, layout=row_layout),
        gl.zeros([_WG_ROWS, _L_COLS], gl.float32, layout=l_layout),
    )

    acc, m_i, l_i, tot, p_op = _attend_tiles(
        WG, acc, m_i, l_i, tot, p_op, q, ones, k_bufs, v_bufs, bars, scale_log2e, q_pos,
        seg_lens, seg_lo, kv_end, 1, full_tiles, BLOCK_N, NUM_STAGES, False, PINGPONG,
    )  # fmt: skip
    acc, m_i, l_i, tot, p_op = _attend_tiles(
        WG, acc, m_i, l_i, tot, p_op, q, ones, k_bufs, v_bufs, bars, scale_log2e, q_pos,
        seg_lens, seg_lo, kv_end, gl.maximum(full_tiles, 1), num_tiles, BLOCK_N, NUM_STAGES,
        True, PINGPONG,
    )  # fmt: skip

    last = (num_tiles - 1) % NUM_STAGES
    mbarrier.wait(v_ready.index(last), ((num_tiles - 1) // NUM_STAGES) & 1)
    _take_turn(turns, WG, num_tiles, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    l_i = warpgroup_mma(gl.convert_layout(p_op, gl.DotOperandLayout(0, l_layout, 2)), ones,
                        l_i, is_async=True)  # fmt: skip
    _pass_turn(turns, WG, PINGPONG)
    acc, l_i = warpgroup_mma_wait(0, deps=[acc, l_i])
    mbarrier.arrive(v_empty.index(last))

    # The walk's closing folds: the rows whose segment ends with the last tile, then every
    # row's (possibly empty) last segment.
    tot_acc, tot_m, tot_l = tot
    end = num_tiles * BLOCK_N
    if (end & (seg_lo - 1)) == 0:
        ended = (end & (seg_lens - 1)) == 0
        tot_acc, tot_m, tot_l = _fold_ended(tot_acc, tot_m, tot_l, acc, m_i, l_i, ended)
        acc, m_i, l_i = _restart(acc, m_i, l_i, ended)
    every = gl.full([_WG_ROWS], 1, gl.int1, layout=row_layout)
    tot_acc, tot_m, tot_l = _fold_ended(tot_acc, tot_m, tot_l, acc, m_i, l_i, every)

    l_row = gl.max(tot_l, axis=1)  # its columns are equal: exact
    _store_rows(tot_acc, gl.where(l_row == 0.0, 1.0, l_row), out_ptr, q_row - t0, rows,
                query_len, head, stride_ot, stride_oh, HEAD_DIM)  # fmt: skip


@_jit(**BATCH_ARGS)  # the default kernel's: no specialization on batch-dependent arguments
def _gluon_bi_kernel(
    q_desc, k_desc, v_desc, out_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale_log2e, num_seqs, start_row, stride_ot, stride_oh, stride_bt,
    NUM_HEADS: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    PINGPONG: gl.constexpr, KV_HEAD_MAJOR: gl.constexpr, SEG_MIN: gl.constexpr,
    SEG_PER_ROW: gl.constexpr, SEG_MAX: gl.constexpr,
):  # fmt: skip
    """The grid and program order of `_gluon_prefill_kernel`; shared memory adds the
    [BLOCK_N, L_COLS] block of ones that the row-sum MMA reads."""
    head, tile_id = _program(NUM_HEADS, GROUP, KV_HEAD_MAJOR)
    seq, q_start, t0, query_len = _tile_rows(query_start_loc_ptr, num_seqs, start_row, tile_id)
    if t0 >= query_len:
        return
    ctx_start, kv_end, full_tiles, num_tiles = _tile_keys(seq_lens_ptr, seq, t0, query_len, BLOCK_N)
    bufs, bars = _allocate_ring(q_desc, k_desc, v_desc, HEAD_DIM, BLOCK_N, NUM_STAGES)
    dtype: gl.constexpr = q_desc.dtype
    ones_layout: gl.constexpr = gl.NVMMASharedLayout(
        swizzle_byte_width=32, element_bitwidth=dtype.primitive_bitwidth, rank=2
    )
    fill: gl.constexpr = gl.BlockedLayout([1, _L_COLS], [32, 1], [4, 1], [1, 0])
    ones = gl.allocate_shared_memory(
        dtype, [BLOCK_N, _L_COLS], ones_layout,
        gl.full([BLOCK_N, _L_COLS], 1.0, dtype, layout=fill),
    )  # fmt: skip
    fence_async_shared()  # wgmma reads the ones through the async proxy
    tile = (q_start + t0, head, t0, query_len, ctx_start, kv_end, full_tiles, num_tiles)
    block_table = block_table_ptr + seq.to(gl.int64) * stride_bt
    gl.warp_specialize(
        [
            (_consumer, (0, bufs, ones, bars, tile, out_ptr, scale_log2e, stride_ot, stride_oh,
                         HEAD_DIM, BLOCK_N, NUM_STAGES, PINGPONG, SEG_MIN, SEG_PER_ROW,
                         SEG_MAX)),
            (_consumer, (1, bufs, ones, bars, tile, out_ptr, scale_log2e, stride_ot, stride_oh,
                         HEAD_DIM, BLOCK_N, NUM_STAGES, PINGPONG, SEG_MIN, SEG_PER_ROW,
                         SEG_MAX)),
            (_producer, ((q_desc, k_desc, v_desc), bufs, bars, tile, block_table,
                         head // GROUP, HEAD_DIM, BLOCK_SIZE, BLOCK_N, NUM_STAGES)),
        ],
        [4, 1],
        [_CONSUMER_REGS, _PRODUCER_REGS],
    )  # fmt: skip


def gluon_batch_invariant_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    start_row: int = 0,
    segments: SegmentRule = SEGMENTS,
    *,
    pingpong: bool = True,
    kv_head_major: bool | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """`batch_invariant_attention`'s varlen launch (packed causal queries over their paged
    contexts; writes and returns out) with the same bits per row, on a cache in q's dtype;
    requires `supports(q, kv_cache)` (an fp8 cache raises NotImplementedError: k_scale and
    v_scale must be 1). segments must be the rule the mode's other launches use."""
    fa3._check_inputs(q, kv_cache, query_start_loc, seq_lens, block_tables, scale, out)
    check_kv_scales(kv_cache, k_scale, v_scale)
    if not supports(q, kv_cache):
        raise ValueError(
            "gluon_batch_invariant_attention needs what gluon_prefill_attention needs (CUDA on "
            "a 9.x GPU with Gluon's Hopper API, q and cache in one of bf16/fp16, block_size a "
            "power of two >= 8, q's heads contiguous) and head_dim 64 or 128"
        )
    num_seqs = seq_lens.shape[0]
    num_rows = q.shape[0] - start_row
    if num_seqs == 0 or num_rows <= 0:
        return out
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    block_n = batch_invariant_config(head_dim, q.element_size())[1]
    num_stages = _STAGES[head_dim]
    if segments.min_len % block_n:
        msg = f"segments.min_len ({segments.min_len}) must be a multiple of block_n ({block_n})"
        raise ValueError(msg)
    smem = q.element_size() * (head_dim * (BLOCK_M + 2 * num_stages * block_n) + block_n * L_COLS)
    if smem > SHARED_MEMORY_LIMIT:
        raise ValueError(f"needs {smem} B of shared memory, more than {SHARED_MEMORY_LIMIT}")
    descs, grid, kv_head_major = fa3.launch_plan(
        q, kv_cache, block_n, num_seqs, kv_head_major, start_row
    )
    _gluon_bi_kernel[grid](
        *descs, out, block_tables, seq_lens, query_start_loc,
        scale * LOG2E, num_seqs, start_row, out.stride(0), out.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, NUM_STAGES=num_stages, PINGPONG=pingpong,
        KV_HEAD_MAJOR=kv_head_major, SEG_MIN=segments.min_len, SEG_PER_ROW=segments.per_row,
        SEG_MAX=segments.max_len,
        num_warps=4,
    )  # fmt: skip
    return out
