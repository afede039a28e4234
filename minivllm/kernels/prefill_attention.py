"""Varlen paged attention: packed queries of several requests attend causally over their
whole paged context (full prefills, chunked continuations, prefix-cache hits).

GQA: the query heads of a KV group are folded into the M dimension of `tl.dot`, so each K/V
tile is read once per group. Tiles are found in-kernel (binary search), with no host sync.
An fp8 cache is converted to q's dtype tile by tile, its scales folded into the softmax scale
(K) and the output (V).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import (
    LOG2E,
    check_kv_scales,
    check_paged_attention,
    check_same,
    check_tensor,
)
from minivllm.kernels.float32_dot import dot
from minivllm.kernels.tiling import fit_attention_tiles

# Below this many programs (about one wave of SMs on H100/H200) the few long causal tiles set
# the time, so the launcher switches to the small config: shorter programs, more of them.
MIN_PROGRAMS = 132
# head_dim bound -> (large, small) configs, each (BLOCK_M rows = query tokens * group,
# BLOCK_N, num_warps, num_stages). num_stages >= 3 keeps two K/V tiles in flight (loads of a
# tile wait on nothing issued in its own iteration); 2 leaves the load latency exposed.
# hd128: (128, 128, 8, 3) needs 224 KB of shared memory, at the limit: see bench_kernels.py.
_CONFIGS = (
    (64, ((128, 64, 4, 3), (64, 64, 4, 3))),
    (128, ((128, 64, 8, 3), (64, 64, 4, 3))),
    (256, ((64, 32, 8, 2), (64, 32, 8, 2))),
)


def prefill_config(
    head_dim: int, num_rows: int, group: int, num_kv_heads: int, elem_size: int = 2
) -> tuple[int, int, int, int]:
    """The (block_m, block_n, num_warps, num_stages) the launcher uses for this batch shape;
    elem_size: bytes per q / KV element (the table is for 2; 4 gets tiles that still fit)."""
    for bound, (large, small) in _CONFIGS:
        if head_dim <= bound:
            num_programs = triton.cdiv(num_rows * group, large[0]) * num_kv_heads
            block_m, block_n, num_warps, num_stages = (
                large if num_programs >= MIN_PROGRAMS else small
            )
            block_m, block_n, num_stages = fit_attention_tiles(
                elem_size, triton.next_power_of_2(head_dim), block_m, block_n, num_stages
            )
            return block_m, block_n, num_warps, num_stages
    raise ValueError(f"head_dim {head_dim} > 256 is not supported")


@triton.jit
def _load_rows(ptrs, valid, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               MASKED: tl.constexpr):  # fmt: skip
    """[BLOCK_N, BLOCK_D] K or V rows; unmasked (plain cp.async) when nothing can be out.
    Callers convert them to q's dtype: a no-op (no code) unless the cache is fp8."""
    if MASKED:
        rows = tl.load(ptrs, mask=valid[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    elif HEAD_DIM == BLOCK_D:
        rows = tl.load(ptrs)
    else:
        rows = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    return rows


@triton.jit
def _tile_block_ids(block_table, n0, offs_n, kv_end, BLOCK_SIZE: tl.constexpr):
    """[BLOCK_N] cache block of each key position n0 + offs_n (0 past kv_end)."""
    pos = n0 + offs_n
    return tl.load(block_table + pos // BLOCK_SIZE, mask=pos < kv_end, other=0)


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, q_pos, n0, kv_end, block_ids, k_base, v_base, scale_log2e,
    offs_n, offs_d,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One online-softmax step over keys [n0, n0 + BLOCK_N), whose cache blocks are block_ids.
    MASKED: apply causal/end masks."""
    pos = n0 + offs_n
    valid = pos < kv_end
    slots = block_ids.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    offs = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    k = _load_rows(k_base + offs, valid, offs_d, HEAD_DIM, BLOCK_D, MASKED).to(q.dtype)
    s = dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N], unscaled
    if MASKED:
        visible = (pos[None, :] <= q_pos[:, None]) & valid[None, :]
        s = tl.where(visible, s, float("-inf"))
    # scale > 0 commutes with max, so scaling costs one FMA per score (with the subtraction).
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2e)
    p = tl.exp2(tl.fma(s, scale_log2e, -m_new[:, None]))
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_rows(v_base + offs, valid, offs_d, HEAD_DIM, BLOCK_D, MASKED).to(q.dtype)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _find_tile(query_start_loc_ptr, num_seqs, start_row, tile_id, BLOCK_Q: tl.constexpr):
    """Request i owns tiles from (query_start_loc[i] - start_row) // BLOCK_Q + i on (a
    monotone sequence with room for cdiv(query_len, BLOCK_Q) tiles); binary-search tile_id."""
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = (tl.load(query_start_loc_ptr + mid) - start_row) // BLOCK_Q + mid
        ok = first <= tile_id
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    q_start = tl.load(query_start_loc_ptr + lo)
    tile = tile_id - ((q_start - start_row) // BLOCK_Q + lo)
    return lo, q_start, tile


# Batch-dependent integers and slices (metadata after the decode rows) must not be
# specialized on value or alignment, or every new batch shape would trigger a JIT compile.
@triton.jit(
    do_not_specialize=["num_seqs", "start_row", "stride_bt"],
    do_not_specialize_on_alignment=["block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"],
)
def _prefill_kernel(
    q_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    scale_log2e, v_scale, num_seqs, start_row,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt, v_cache_offset,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr,
):  # fmt: skip
    """Grid ((cdiv(num_rows, BLOCK_Q) + num_seqs) * num_kv_heads,). A program owns BLOCK_Q
    query tokens of one request times the GROUP heads of one kv head (row r: token r // GROUP,
    head r % GROUP); programs past a request's last tile exit at once. KV_FP8: the cache is
    e4m3, k_scale already in scale_log2e, v_scale applied to the output."""
    # kv heads vary fastest and tiles run last-first, so the longest (latest causal) tiles of
    # every head start in the first wave: near longest-first scheduling, a short tail.
    pid = tl.program_id(0)
    kv_head = pid % NUM_KV_HEADS
    tile_id = tl.num_programs(0) // NUM_KV_HEADS - 1 - pid // NUM_KV_HEADS
    seq, q_start, tile = _find_tile(query_start_loc_ptr, num_seqs, start_row, tile_id, BLOCK_Q)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    t0 = tile * BLOCK_Q
    if t0 >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_start = seq_len - query_len  # position of the request's first query token

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
    if KV_FP8 and q.dtype == tl.bfloat16:
        # e4m3 -> fp16 is one cvt per pair on sm_89+ (-> bf16 is not): both dots in fp16.
        q = q.to(tl.float16)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    block_table = block_table_ptr + seq.to(tl.int64) * stride_bt
    k_base = cache_ptr + kv_head * HEAD_DIM
    v_base = k_base + v_cache_offset
    # Keys < first query position + 1 are visible to every row: no masks there.
    kv_end = ctx_start + tl.minimum(t0 + BLOCK_Q, query_len)
    full_end = (ctx_start + t0 + 1) // BLOCK_N * BLOCK_N
    # Block ids are loaded one tile ahead, so the K/V addresses of a tile never wait on a
    # load issued in the same iteration and the K/V loads can be pipelined deeper.
    block_ids = _tile_block_ids(block_table, 0, offs_n, kv_end, BLOCK_SIZE)
    for n0 in range(0, full_end, BLOCK_N):
        next_ids = _tile_block_ids(block_table, n0 + BLOCK_N, offs_n, kv_end, BLOCK_SIZE)
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, n0, kv_end, block_ids, k_base, v_base, scale_log2e,
            offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_D, BLOCK_SIZE, False,
        )  # fmt: skip
        block_ids = next_ids
    for n0 in range(full_end, kv_end, BLOCK_N):
        next_ids = _tile_block_ids(block_table, n0 + BLOCK_N, offs_n, kv_end, BLOCK_SIZE)
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, q_pos, n0, kv_end, block_ids, k_base, v_base, scale_log2e,
            offs_n, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_D, BLOCK_SIZE, True,
        )  # fmt: skip
        block_ids = next_ids

    o = acc / l_i[:, None]
    if KV_FP8:
        o = o * v_scale
    dst = out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=io_mask)


def _check_inputs(q, kv_cache, query_start_loc, seq_lens, block_tables, scale, out) -> None:
    check_paged_attention(q, kv_cache, block_tables, seq_lens, out)
    check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    check_same(
        "query_start_loc length", query_start_loc.shape[0], "num_seqs + 1", 1 + len(seq_lens)
    )
    if not scale > 0:
        raise ValueError(f"scale must be > 0 (it is folded into the softmax max), got {scale}")


def prefill_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    start_row: int = 0,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of packed queries over their paged contexts; writes and returns out.

    q, out: [num_rows, num_heads, head_dim] (last dim contiguous). query_start_loc:
    [num_seqs + 1] int32, absolute row offsets into q, the first equal to `start_row` (rows
    before it belong to someone else, e.g. decodes). seq_lens: [num_seqs] int32 contexts incl.
    the new tokens; query j of request i sits at position seq_lens[i] - query_len_i + j.
    block_tables: [num_seqs, max_num_blocks] int32. kv_cache: [2, num_blocks, block_size,
    num_kv_heads, head_dim], block_size any power of two. scale > 0. block_m, block_n (powers
    of two >= 16; tests use small ones), num_warps and num_stages override `prefill_config`.
    A float8_e4m3fn kv_cache holds K / k_scale and V / v_scale (store_kv); other caches take
    scales of 1.0. No host syncs.
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
    elem_size = max(q.element_size(), kv_cache.element_size())
    cfg_m, cfg_n, cfg_warps, cfg_stages = prefill_config(
        head_dim, num_rows, group, num_kv_heads, elem_size
    )
    block_m = max(block_m or cfg_m, triton.next_power_of_2(group))
    block_n = block_n or cfg_n
    for name, val in (("block_m", block_m), ("block_n", block_n)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {val}")
    block_q = block_m // group
    grid = ((triton.cdiv(num_rows, block_q) + num_seqs) * num_kv_heads,)
    _prefill_kernel[grid](
        q, kv_cache, block_tables, seq_lens, query_start_loc, out,
        scale * LOG2E * k_scale, v_scale, num_seqs, start_row,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        kv_cache[0].numel(),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2], BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), KV_FP8=is_fp8,
        num_warps=num_warps or cfg_warps, num_stages=num_stages or cfg_stages,
    )  # fmt: skip
    return out
