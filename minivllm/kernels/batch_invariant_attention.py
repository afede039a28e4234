"""Batch-invariant paged attention (deterministic mode): a query row gets the same bits whether
it is a decode or part of a prefill chunk, and whatever else is in the batch.

One fixed tile config per head_dim. A row's keys are cut into segments whose length depends
on the row's own position (`SegmentRule`), aligned to absolute positions; each segment is an
online softmax over BLOCK_N tiles from a fresh state, and segments are folded left to right
with one formula (`_fold`). One program can walk all segments (varlen launch), or one program
per segment writes its partial state and a fold kernel merges them in the same order (split
launch, for small decode batches): the choice is a speed decision only, it never changes a
bit. Tiles past a row's position are fully masked and add exact zeros (p = 0, alpha = 1), so
the extra tiles a prefill row sees change nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.attention_segments import SEGMENTS, SegmentRule, segment_len
from minivllm.kernels.batch_invariant_configs import batch_invariant_config
from minivllm.kernels.checks import LOG2E, check_kv_scales
from minivllm.kernels.prefill_attention import _check_inputs, _find_tile, _load_rows

L_COLS: tl.constexpr = tl.constexpr(16)  # columns of the row-sum MMA (tl.dot's minimum N)


@triton.jit
def _tile_scores(
    q, q_pos, n0, kv_end, block_table, k_base, offs_n, offs_d,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """The first half of a tile step over keys [n0, n0 + BLOCK_N): the unscaled scores s
    [BLOCK_M, BLOCK_N] (-inf where masked), and the tile's cache offsets and valid keys, which
    `_tile_update` reads V with."""
    pos = n0 + offs_n
    valid = pos < kv_end
    block_ids = tl.load(block_table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    slots = block_ids * BLOCK_SIZE + pos % BLOCK_SIZE
    offs = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    k = _load_rows(k_base + offs, valid, offs_d, HEAD_DIM, BLOCK_D, MASKED).to(q.dtype)
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        visible = (pos[None, :] <= q_pos[:, None]) & valid[None, :]
        s = tl.where(visible, s, float("-inf"))
    return s, offs, valid


@triton.jit
def _tile_update(
    acc, m_i, l_i, s, offs, valid, v_base, scale_log2e, offs_d, dtype: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
):  # fmt: skip
    """The second half: the online-softmax update of (acc, m_i, l_i) by the tile's scores. A
    row that has seen no visible key yet keeps m_i = -inf, l_i = 0, acc = 0 (the m_use guard),
    so a fresh segment that is fully masked for it yields an exact zero state instead of NaN.
    l_i: [BLOCK_M, L_COLS], every column the row's sum."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2e)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(tl.fma(s, scale_log2e, -m_use[:, None]))
    alpha = tl.exp2(m_i - m_use)
    v = _load_rows(v_base + offs, valid, offs_d, HEAD_DIM, BLOCK_D, MASKED).to(dtype)
    p = p.to(v.dtype)
    # Row sums by an MMA against ones, like acc: each element is one in-order chain over the
    # keys whatever the tile shape. tl.sum's tree follows the register layout, which changes
    # with BLOCK_M and num_warps, so decode and prefill tiles would round l differently.
    ones = tl.full([BLOCK_N, L_COLS], 1.0, v.dtype)
    l_i = tl.dot(p, ones, l_i * alpha[:, None])
    acc = tl.dot(p, v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _tile_step(
    acc, m_i, l_i, q, q_pos, n0, kv_end, block_table, k_base, v_base, scale_log2e,
    offs_n, offs_d,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One online-softmax step over keys [n0, n0 + BLOCK_N): `_tile_scores`, then
    `_tile_update`."""
    s, offs, valid = _tile_scores(
        q, q_pos, n0, kv_end, block_table, k_base, offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM,
        BLOCK_D, BLOCK_SIZE, MASKED,
    )  # fmt: skip
    return _tile_update(
        acc, m_i, l_i, s, offs, valid, v_base, scale_log2e, offs_d, q.dtype, HEAD_DIM, BLOCK_D,
        BLOCK_N, MASKED,
    )  # fmt: skip


@triton.jit
def _segment(
    q, q_pos, seg_start, seg_len, full_end, kv_end, block_table, k_base, v_base, scale_log2e,
    offs_n, offs_d,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """(acc, m_i, l_i) of keys [seg_start, seg_start + seg_len) from a fresh state. Keys below
    full_end are visible to every row of the tile (no masks); tiles start at multiples of
    BLOCK_N in every path."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M, L_COLS], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    seg_end = tl.minimum(seg_start + seg_len, kv_end)
    mid = tl.minimum(tl.maximum(full_end, seg_start), seg_end)
    for n0 in range(seg_start, mid, BLOCK_N):
        acc, m_i, l_i = _tile_step(
            acc, m_i, l_i, q, q_pos, n0, kv_end, block_table, k_base, v_base, scale_log2e,
            offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, False,
        )  # fmt: skip
    for n0 in range(mid, seg_end, BLOCK_N):
        acc, m_i, l_i = _tile_step(
            acc, m_i, l_i, q, q_pos, n0, kv_end, block_table, k_base, v_base, scale_log2e,
            offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, True,
        )  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _fold(acc, m_i, l_i, seg_acc, seg_m, seg_l):
    """Merges a segment's state into the running one (m: [R], l: [R, C], acc: [R, D]). The
    same function runs in both launches; explicit FMAs leave the compiler no contraction
    choice."""
    m_new = tl.maximum(m_i, seg_m)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp2(m_i - m_use)
    b = tl.exp2(seg_m - m_use)
    l_i = tl.fma(l_i, a[:, None], seg_l * b[:, None])
    acc = tl.fma(acc, a[:, None], seg_acc * b[:, None])
    return acc, m_new, l_i


@triton.jit
def _fold_ended(acc, m_i, l_i, seg_acc, seg_m, seg_l, ended):
    """`_fold` for the rows whose segment ended (ended: [R]), which restart from a fresh
    segment state; the other rows keep both states bit for bit."""
    f_acc, f_m, f_l = _fold(acc, m_i, l_i, seg_acc, seg_m, seg_l)
    acc = tl.where(ended[:, None], f_acc, acc)
    m_i = tl.where(ended, f_m, m_i)
    l_i = tl.where(ended[:, None], f_l, l_i)
    seg_acc = tl.where(ended[:, None], 0.0, seg_acc)
    seg_m = tl.where(ended, float("-inf"), seg_m)
    seg_l = tl.where(ended[:, None], 0.0, seg_l)
    return acc, m_i, l_i, seg_acc, seg_m, seg_l


@triton.jit
def _walk_step(
    acc, m_i, l_i, seg_acc, seg_m, seg_l, seg_lens, seg_lo, q, q_pos, n0, kv_end, block_table,
    k_base, v_base, scale_log2e, offs_n, offs_d,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """The walk's tile at n0: its QK^T; the fold of the rows whose segment the tile before
    closed (a longer segment, a power-of-two multiple of the shortest, seg_lo, ends only where
    the shortest does); then the tile's update of the segment state."""
    s, offs, valid = _tile_scores(
        q, q_pos, n0, kv_end, block_table, k_base, offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM,
        BLOCK_D, BLOCK_SIZE, MASKED,
    )  # fmt: skip
    if n0 > 0 and (n0 & (seg_lo - 1)) == 0:
        acc, m_i, l_i, seg_acc, seg_m, seg_l = _fold_ended(
            acc, m_i, l_i, seg_acc, seg_m, seg_l, (n0 & (seg_lens - 1)) == 0
        )
    seg_acc, seg_m, seg_l = _tile_update(
        seg_acc, seg_m, seg_l, s, offs, valid, v_base, scale_log2e, offs_d, q.dtype, HEAD_DIM,
        BLOCK_D, BLOCK_N, MASKED,
    )  # fmt: skip
    return acc, m_i, l_i, seg_acc, seg_m, seg_l


@triton.jit
def _walk(
    q, q_pos, seg_lens, seg_lo, full_end, kv_end, block_table, k_base, v_base, scale_log2e,
    offs_n, offs_d,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """All segments of keys [0, kv_end) in one pipelined pass: the same tile steps as `_segment`
    makes; at a tile end that closes a row's segment (seg_lens: [BLOCK_M], powers of two;
    seg_lo: the smallest, as a scalar) that row's segment state is folded into its total and
    reset, so every row sees exactly `_segment` then `_fold` per segment of its own length. A
    fold runs in the next tile's step (`_walk_step`), after its QK^T: the wait for that MMA
    also covers the previous tile's (asynchronous) MMAs, whereas a fold right after them would
    read accumulators still in flight, and ptxas then serializes every wgmma of the kernel
    (warning C7515, `benchmarks/kernels/kernel_resources.py`). The closing fold of an empty
    state (loop ended on a boundary) changes nothing: a = 1, b = 0 exactly."""
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M, L_COLS], tl.float32)
    seg_acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    seg_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    seg_l = tl.zeros([BLOCK_M, L_COLS], tl.float32)
    for n0 in range(0, full_end, BLOCK_N):
        acc, m_i, l_i, seg_acc, seg_m, seg_l = _walk_step(
            acc, m_i, l_i, seg_acc, seg_m, seg_l, seg_lens, seg_lo, q, q_pos, n0, kv_end,
            block_table, k_base, v_base, scale_log2e, offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM,
            BLOCK_SIZE, BLOCK_N, BLOCK_D, False,
        )  # fmt: skip
    for n0 in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i, seg_acc, seg_m, seg_l = _walk_step(
            acc, m_i, l_i, seg_acc, seg_m, seg_l, seg_lens, seg_lo, q, q_pos, n0, kv_end,
            block_table, k_base, v_base, scale_log2e, offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM,
            BLOCK_SIZE, BLOCK_N, BLOCK_D, True,
        )  # fmt: skip
    end = tl.cdiv(kv_end, BLOCK_N) * BLOCK_N  # the last tile's end
    if (end & (seg_lo - 1)) == 0:
        acc, m_i, l_i, seg_acc, seg_m, seg_l = _fold_ended(
            acc, m_i, l_i, seg_acc, seg_m, seg_l, (end & (seg_lens - 1)) == 0
        )
    return _fold(acc, m_i, l_i, seg_acc, seg_m, seg_l)


# Batch-dependent integers and metadata slices: no value/alignment specialization (no JIT
# compile per batch shape), as in the prefill kernel.
@triton.jit(
    do_not_specialize=["num_seqs", "start_row", "stride_bt"],
    do_not_specialize_on_alignment=["block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"],
)
def _bi_attention_kernel(
    q_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,
    scale_log2e, v_scale, num_seqs, start_row,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_pa_t, stride_pa_h, stride_pa_s, stride_pm_t, stride_pm_h, v_cache_offset,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SEG_MIN: tl.constexpr,
    SEG_PER_ROW: tl.constexpr, SEG_MAX: tl.constexpr, SPLIT: tl.constexpr,
    DECODE: tl.constexpr, KV_FP8: tl.constexpr,
):  # fmt: skip
    """Grid ((cdiv(num_rows, BLOCK_Q) + num_seqs) * num_kv_heads, num_segments if SPLIT else
    1); DECODE (one row per request): (num_seqs * num_kv_heads, ...), a program per request.
    Tiles as in the prefill kernel (row r: token r // GROUP, head r % GROUP). SPLIT:
    program (tile, s) writes segment s's unnormalized state to part_* (or exits past the
    row's segments); else it folds every segment and writes the output. SEG_*: the
    `SegmentRule`."""
    pid = tl.program_id(0)
    kv_head = pid % NUM_KV_HEADS
    if DECODE:  # no tile search, no idle programs
        seq = pid // NUM_KV_HEADS
        q_start = tl.load(query_start_loc_ptr + seq)
        tile = 0
    else:
        tile_id = tl.num_programs(0) // NUM_KV_HEADS - 1 - pid // NUM_KV_HEADS
        seq, q_start, tile = _find_tile(query_start_loc_ptr, num_seqs, start_row, tile_id, BLOCK_Q)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    t0 = tile * BLOCK_Q
    if t0 >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_start = seq_len - query_len
    kv_end = ctx_start + tl.minimum(t0 + BLOCK_Q, query_len)
    seg_id = tl.program_id(1)
    if SPLIT:  # one decode row: its context is kv_end
        seg_len = segment_len(kv_end, SEG_MIN, SEG_PER_ROW, SEG_MAX)
        if seg_id * seg_len >= kv_end:
            return

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    tok = t0 + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    m_mask = (tok < query_len) & (offs_m < BLOCK_Q * GROUP)
    q_pos = ctx_start + tok
    rows = (q_start + tok).to(tl.int64)
    io_mask = m_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=io_mask,
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    block_table = block_table_ptr + seq.to(tl.int64) * stride_bt
    k_base = cache_ptr + kv_head * HEAD_DIM
    v_base = k_base + v_cache_offset
    full_end = (ctx_start + t0 + 1) // BLOCK_N * BLOCK_N
    if SPLIT:
        acc, m_i, l_i = _segment(
            q, q_pos, seg_id * seg_len, seg_len, full_end, kv_end, block_table, k_base, v_base,
            scale_log2e, offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_M,
            BLOCK_N, BLOCK_D,
        )  # fmt: skip
        part = rows * stride_pa_t + heads * stride_pa_h + seg_id * stride_pa_s
        tl.store(part_acc_ptr + part[:, None] + offs_d[None, :], acc, mask=io_mask)
        ml = rows * stride_pm_t + heads * stride_pm_h + seg_id
        tl.store(part_m_ptr + ml, m_i, mask=m_mask)
        tl.store(part_l_ptr + ml, tl.max(l_i, 1), mask=m_mask)  # columns equal: exact
    else:
        # A row's segment length from its own context; the tile's first row has the shortest.
        seg_lens = segment_len(q_pos + 1, SEG_MIN, SEG_PER_ROW, SEG_MAX)
        seg_lo = segment_len(ctx_start + t0 + 1, SEG_MIN, SEG_PER_ROW, SEG_MAX)
        acc, m_i, l_i = _walk(
            q, q_pos, seg_lens, seg_lo, full_end, kv_end, block_table, k_base, v_base,
            scale_log2e, offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_M, BLOCK_N,
            BLOCK_D,
        )  # fmt: skip
        l_row = tl.max(l_i, 1)  # columns equal: exact
        o = acc / tl.where(l_row == 0.0, 1.0, l_row)[:, None]
        if KV_FP8:  # e4m3 cache: V / v_scale (k_scale is in scale_log2e)
            o = o * v_scale
        dst = out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _load_part(acc_ptrs, m_ptrs, l_ptrs, seg, num_segs, stride_s, g_mask, d_mask):
    """Segment seg's written state of one decode row's heads, acc [G, D], m [G], l [G, 1], from
    the pointers of its segment 0 (acc_ptrs [G, D], m_ptrs and l_ptrs [G]); an empty state
    (nothing read) past the row's num_segs."""
    g_mask = g_mask & (tl.zeros(g_mask.shape, tl.int32) + seg < num_segs)  # a tensor mask
    seg_acc = tl.load(acc_ptrs + seg * stride_s, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    seg_m = tl.load(m_ptrs + seg, mask=g_mask, other=float("-inf"))
    seg_l = tl.load(l_ptrs + seg, mask=g_mask, other=0.0)
    return seg_acc, seg_m, seg_l[:, None]


@triton.jit
def _fold_if(acc, m_i, l_i, seg_acc, seg_m, seg_l, seg, num_segs):
    """`_fold` of segment seg when the row has it (a uniform branch: no fold of padding)."""
    if seg < num_segs:
        acc, m_i, l_i = _fold(acc, m_i, l_i, seg_acc, seg_m, seg_l)
    return acc, m_i, l_i


# seq_lens may be a slice of the step's packed inputs: no alignment specialization, or a split
# decode beside a prefill would compile a second variant mid-run (seen on the H200).
@triton.jit(do_not_specialize_on_alignment=["seq_lens_ptr"])
def _fold_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, seq_lens_ptr, out_ptr, v_scale,
    stride_pa_t, stride_pa_h, stride_pa_s, stride_pm_t, stride_pm_h, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr, SEG_MIN: tl.constexpr, SEG_PER_ROW: tl.constexpr,
    SEG_MAX: tl.constexpr, KV_FP8: tl.constexpr,
):  # fmt: skip
    """Grid (num_seqs, num_kv_heads): folds the segment states of the GROUP heads of one
    decode row (cdiv(seq_len, its segment length) of them), left to right, exactly as the
    varlen launch does. The states are read four at a time, the four loads issued before
    the first of their folds."""
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * GROUP + tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = tl.arange(0, BLOCK_G) < GROUP
    d_mask = offs_d < HEAD_DIM
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G, 1], tl.float32)  # [R, C] as `_fold` takes it
    seq_len = tl.load(seq_lens_ptr + row)
    num_segs = tl.cdiv(seq_len, segment_len(seq_len, SEG_MIN, SEG_PER_ROW, SEG_MAX))
    acc_ptrs = part_acc_ptr + (row * stride_pa_t + heads * stride_pa_h)[:, None] + offs_d[None, :]
    ml = row * stride_pm_t + heads * stride_pm_h
    m_ptrs, l_ptrs = part_m_ptr + ml, part_l_ptr + ml
    for seg in range(0, num_segs, 4):
        a0, m0, l0 = _load_part(
            acc_ptrs, m_ptrs, l_ptrs, seg, num_segs, stride_pa_s, g_mask, d_mask
        )
        a1, m1, l1 = _load_part(
            acc_ptrs, m_ptrs, l_ptrs, seg + 1, num_segs, stride_pa_s, g_mask, d_mask
        )
        a2, m2, l2 = _load_part(
            acc_ptrs, m_ptrs, l_ptrs, seg + 2, num_segs, stride_pa_s, g_mask, d_mask
        )
        a3, m3, l3 = _load_part(
            acc_ptrs, m_ptrs, l_ptrs, seg + 3, num_segs, stride_pa_s, g_mask, d_mask
        )
        acc, m_i, l_i = _fold(acc, m_i, l_i, a0, m0, l0)
        acc, m_i, l_i = _fold_if(acc, m_i, l_i, a1, m1, l1, seg + 1, num_segs)
        acc, m_i, l_i = _fold_if(acc, m_i, l_i, a2, m2, l2, seg + 2, num_segs)
        acc, m_i, l_i = _fold_if(acc, m_i, l_i, a3, m3, l3, seg + 3, num_segs)
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)
    if KV_FP8:
        o = o * v_scale
    dst = out_ptr + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def _check_split(part_acc, part_m, part_l, q, num_segments) -> None:
    num_rows, num_heads, head_dim = q.shape
    for name, t, dims in (("part_acc", part_acc, 4), ("part_m", part_m, 3), ("part_l", part_l, 3)):
        if t is None or t.dim() != dims or t.dtype != torch.float32 or t.stride(-1) != 1:
            raise ValueError(f"split launch needs {name}: {dims}-D float32, unit last stride")
    if (
        part_acc.shape[0] < num_rows
        or tuple(part_acc.shape[1::2]) != (num_heads, head_dim)
        or part_acc.shape[2] < num_segments
    ):
        raise ValueError(
            f"part_acc must be [>= {num_rows}, {num_heads}, >= {num_segments}, {head_dim}], "
            f"got {tuple(part_acc.shape)}"
        )
    for name, t in (("part_m", part_m), ("part_l", part_l)):
        if tuple(t.shape) != tuple(part_acc.shape[:3]):
            raise ValueError(f"{name} must be {tuple(part_acc.shape[:3])}, got {tuple(t.shape)}")


def batch_invariant_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    start_row: int = 0,
    num_segments: int = 0,
    part_acc: torch.Tensor | None = None,
    part_m: torch.Tensor | None = None,
    part_l: torch.Tensor | None = None,
    segments: SegmentRule = SEGMENTS,
    config: tuple[int, int, int, int] | None = None,
    decode_rows: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of packed queries over their paged contexts; writes and returns out.

    Shapes and conventions as `prefill_attention` (decode rows are requests of one query
    token). num_segments > 0 is the split launch, for decode rows only (one query token per
    request, start_row 0): grid axis of num_segments >= segments.max_count(max seq_len)
    segment programs writing part_acc [>= num_rows, num_heads, >= num_segments, head_dim] and
    part_m, part_l [>= num_rows, num_heads, >= num_segments] float32, then a fold kernel.
    Both launches give identical bits for a row. decode_rows: every request has one query
    row (start_row 0), so the decode tile config applies; the split launch implies it.
    segments (its min_len a multiple of block_n) and block_n must stay fixed for an engine's
    lifetime; segments and config (block_m, block_n, num_warps, num_stages) override the
    defaults (tests, tuning). No host syncs; graph-capturable for a fixed num_segments.
    k_scale, v_scale: an fp8 cache's scales.
    """
    _check_inputs(q, kv_cache, query_start_loc, seq_lens, block_tables, scale, out)
    is_fp8 = check_kv_scales(kv_cache, k_scale, v_scale)
    num_seqs = seq_lens.shape[0]
    num_rows = q.shape[0] - start_row
    if num_seqs == 0 or num_rows <= 0:
        return out
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    split = num_segments > 0
    if (split or decode_rows) and (start_row != 0 or num_rows != num_seqs):
        raise ValueError("the split and decode launches take decode rows only (one per request)")
    elem_size = max(q.element_size(), kv_cache.element_size())
    block_m, block_n, num_warps, num_stages = config or batch_invariant_config(
        head_dim, elem_size, decode=split or decode_rows
    )
    block_m = max(block_m, triton.next_power_of_2(group))
    for name, val in (("block_m", block_m), ("block_n", block_n)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {val}")
    if segments.min_len % block_n:
        msg = f"segments.min_len ({segments.min_len}) must be a multiple of block_n ({block_n})"
        raise ValueError(msg)
    if split:
        _check_split(part_acc, part_m, part_l, q, num_segments)
        pa, pm = part_acc.stride()[:3], part_m.stride()[:2]
    else:
        part_acc = part_m = part_l = out  # unused by the kernel
        pa, pm = (0, 0, 0), (0, 0)
    block_q = block_m // group
    decode = split or decode_rows
    num_tiles = num_seqs if decode else triton.cdiv(num_rows, block_q) + num_seqs
    grid = (num_tiles * num_kv_heads, max(num_segments, 1))
    _bi_attention_kernel[grid](
        q, kv_cache, block_tables, seq_lens, query_start_loc, out, part_acc, part_m, part_l,
        scale * LOG2E * k_scale, v_scale, num_seqs, start_row,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        *pa, *pm, kv_cache[0].numel(),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2], BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), SEG_MIN=segments.min_len,
        SEG_PER_ROW=segments.per_row, SEG_MAX=segments.max_len, SPLIT=split, DECODE=decode,
        KV_FP8=is_fp8, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if split:
        _fold_kernel[(num_seqs, num_kv_heads)](
            part_acc, part_m, part_l, seq_lens, out, v_scale, *pa, *pm, out.stride(0),
            out.stride(1), GROUP=group, HEAD_DIM=head_dim, BLOCK_G=triton.next_power_of_2(group),
            BLOCK_D=triton.next_power_of_2(head_dim), SEG_MIN=segments.min_len,
            SEG_PER_ROW=segments.per_row, SEG_MAX=segments.max_len, KV_FP8=is_fp8, num_warps=4,
        )  # fmt: skip
    return out
