"""Causal varlen prefill attention over the paged KV cache for Hopper (sm_90a), written in
Triton's Gluon after FlashAttention-3: a TMA producer warp fills a K/V ring that two consumer
warpgroups drain with asynchronous wgmma. Same contract as `prefill_attention`; see `supports`.

Written against triton 3.6's Gluon (`triton.experimental.gluon`); other versions may differ.

One program owns BLOCK_M = 128 query rows of one request and one q head, in three partitions
(`gl.warp_specialize`) that talk through mbarriers in shared memory:

- producer (1 warp, few registers): TMA-loads the Q tile once, then for each key tile of
  BLOCK_N keys waits for a free ring stage and fills its K and V buffers, one box of
  [block_size, head_dim] per cache block, at the block's row of the cache viewed as
  [num_blocks * block_size, num_kv_heads * head_dim]. Cache blocks past the context are
  addressed out of bounds, so TMA writes zeros there (no NaN from stale shared memory).
- two consumers (one warpgroup each, most registers): each owns 64 of the 128 query rows,
  computes S = Q K^T (wgmma, both operands in shared memory) and O += P V (wgmma, P from
  registers), with an online softmax in fp32 and exp2 (the softmax scale folded into log2e).
  A step issues S_j and the PV product of tile j - 1 back to back, then does the softmax of
  S_j. The two warpgroups take turns issuing (FA3's ping-pong), so one's softmax runs while
  the tensor cores work for the other.

Causal masks are applied only on the key tiles that cross the diagonal (a masked loop after an
unmasked one). Queries are packed rows: query j of request i sits at position seq_lens[i] -
query_len_i + j, so a cached prefix (prefix-cache hit, chunked continuation) is attended to.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import (
    FP8_KV_DTYPE,
    LOG2E,
    check_kv_scales,
)

# From the Triton kernel: its input checks, and its tile lookup (scalar code, which Gluon
# compiles as it is).
from minivllm.kernels.prefill_attention import _check_inputs as _check_paged_inputs
from minivllm.kernels.prefill_attention import _find_tile

try:  # Gluon's Hopper API as triton 3.6 lays it out; without it, supports() is False.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _jit = gluon.jit
    _constexpr_function = gluon.constexpr_function
    GLUON_IMPORT_ERROR: ImportError | None = None
except ImportError as err:  # the kernels below are then defined but never compiled
    GLUON_IMPORT_ERROR = err

    def _jit(fn=None, **_kwargs):
        return fn if fn is not None else (lambda f: f)

    def _constexpr_function(fn):
        return fn


BLOCK_M = 128  # query rows per program: two consumer warpgroups of 64 rows (wgmma's M)
# head_dim -> (BLOCK_N keys per tile, ring stages). Shared memory: Q 128 x d plus stages x
# (K + V) of BLOCK_N x d, 2 bytes each: d = 128, (128, 2) is 160 KB (3 stages: 224 KB, the
# edge of the 227 KB limit). FA3 uses 128 x 128 tiles and 2 stages for causal d = 128.
_CONFIGS = {64: (128, 3), 128: (128, 2)}
MIN_BLOCK_SIZE = 8  # a TMA box of block_size rows must cover whole 1 KB swizzle atoms
# Q and the K/V ring must fit H100/H200's 227 KB per block, with 1 KB for the mbarriers and
# what warp_specialize passes its partitions.
SHARED_MEMORY_LIMIT = 226 * 1024
# What the kernels read (jit functions see module globals only as constexprs).
_BLOCK_M = tl.constexpr(BLOCK_M)
_WG_ROWS = tl.constexpr(BLOCK_M // 2)
# Registers per thread: 240 for each consumer warpgroup and 24 for the producer's (its one
# warp padded to a warpgroup) add up to the SM's 64K; Triton hands the default partition (the
# first consumer) what the workers leave, which comes to 240 as well.
_CONSUMER_REGS = tl.constexpr(240)
_PRODUCER_REGS = tl.constexpr(24)


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether gluon_prefill_attention runs these tensors: CUDA on a 9.x GPU (Hopper), Gluon's
    Hopper API importable, bf16/fp16 q and cache of the same dtype, head_dim 64 or 128,
    block_size a power of two >= 8, q's heads contiguous and its rows 16-byte aligned (TMA views
    q as [rows, heads * dim])."""
    if GLUON_IMPORT_ERROR is not None or not (q.is_cuda and kv_cache.is_cuda):
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or kv_cache.dtype != q.dtype:
        return False
    if q.dim() != 3 or kv_cache.dim() != 5 or q.shape[2] not in _CONFIGS:
        return False
    block_size = kv_cache.shape[2]
    return (
        block_size >= MIN_BLOCK_SIZE
        and block_size & (block_size - 1) == 0
        and q.stride(2) == 1
        and q.stride(1) == q.shape[2]
        and q.data_ptr() % 16 == 0  # TMA: 16-byte aligned base and row stride
        and q.stride(0) * q.element_size() % 16 == 0
    )


@_constexpr_function
def wgmma_layout(n):
    """The register layout of a warpgroup's [64, n] wgmma accumulator: its 4 warps along M
    (16 rows each), the whole n in one instruction."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@_jit
def _box_rows(block_table_ptr, n0, kv_end, oob_row, BLOCK_SIZE: gl.constexpr,
              BOX_N: gl.constexpr, NUM_BOXES: gl.constexpr):  # fmt: skip
    """[NUM_BOXES] cache rows where the boxes of key tile n0 start (box b holds positions
    n0 + b * BOX_N ...); boxes at or past kv_end get oob_row, which TMA fills with zeros."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])  # the producer's one warp
    pos = n0 + gl.arange(0, NUM_BOXES, layout=layout) * BOX_N
    valid = pos < kv_end
    block_ids = gl.load(block_table_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
    return gl.where(valid, block_ids * BLOCK_SIZE + pos % BLOCK_SIZE, oob_row)


@_jit
def _load_kv_tile(desc, rows, col, bar, buf, BOX_N: gl.constexpr, NUM_BOXES: gl.constexpr):
    """TMA-load the NUM_BOXES boxes of one K or V tile into buf ([BLOCK_N, HEAD_DIM]); bar
    completes when all their bytes have landed."""
    mbarrier.expect(bar, NUM_BOXES * desc.block_type.nbytes)
    offs = gl.arange(0, NUM_BOXES, layout=rows.type.layout)
    for b in gl.static_range(NUM_BOXES):
        row = gl.sum(gl.where(offs == b, rows, 0), axis=0)  # element b, as a scalar
        tma.async_copy_global_to_shared(desc, [row, col], bar, buf.slice(b * BOX_N, BOX_N))


@_jit
def _producer(descs, bufs, bars, tile, block_table_ptr, kv_head, HEAD_DIM: gl.constexpr,
              BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
              NUM_STAGES: gl.constexpr):  # fmt: skip
    """The load warp: Q once, then K and V of key tiles 0 .. num_tiles - 1 through the ring.
    Stage s of tile j is free once both consumers arrived on its empty barrier for tile
    j - NUM_STAGES (a fresh barrier passes a wait on phase 1, so the first lap does not wait)."""
    q_desc, k_desc, v_desc = descs
    q_smem, k_bufs, v_bufs = bufs
    q_bar, k_ready, k_empty, v_ready, v_empty, _ = bars
    q_row, head, t0, query_len, ctx_start, kv_end, full_tiles, num_tiles = tile
    BOX_N: gl.constexpr = BLOCK_SIZE if BLOCK_SIZE < BLOCK_N else BLOCK_N
    NUM_BOXES: gl.constexpr = BLOCK_N // BOX_N
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, head * HEAD_DIM], q_bar, q_smem)
    oob_row = k_desc.shape[0]  # one past the cache's last row
    col = kv_head * HEAD_DIM
    # Block ids are fetched one tile ahead, so their latency hides behind the ring waits.
    rows = _box_rows(block_table_ptr, 0, kv_end, oob_row, BLOCK_SIZE, BOX_N, NUM_BOXES)
    for j in range(num_tiles):
        next_rows = _box_rows(block_table_ptr, (j + 1) * BLOCK_N, kv_end, oob_row, BLOCK_SIZE,
                              BOX_N, NUM_BOXES)  # fmt: skip
        stage = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        mbarrier.wait(k_empty.index(stage), phase ^ 1)
        _load_kv_tile(k_desc, rows, col, k_ready.index(stage), k_bufs.index(stage), BOX_N,
                      NUM_BOXES)  # fmt: skip
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        _load_kv_tile(v_desc, rows, col, v_ready.index(stage), v_bufs.index(stage), BOX_N,
                      NUM_BOXES)  # fmt: skip
        rows = next_rows


@_jit
def _softmax_step(s, m_i, l_i, scale_log2e, q_pos, n0, kv_end, MASKED: gl.constexpr):
    """Online softmax of one [64, BLOCK_N] score tile s (unscaled Q K^T of keys n0 ...):
    returns (p, m_new, l_new, alpha), p = exp2(s * scale_log2e - m_new) in fp32 and alpha the
    factor that rescales what was accumulated against m_i. MASKED: hide keys past q_pos or
    kv_end (only the tiles that cross the diagonal or the context's end need it)."""
    if MASKED:
        pos = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        visible = (pos[None, :] <= q_pos[:, None]) & (pos < kv_end)[None, :]
        s = gl.where(visible, s, float("-inf"))
    # scale > 0 commutes with max, so the scale costs one FMA per score (with the subtraction).
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2e)
    p = gl.exp2(s * scale_log2e - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_new, alpha


@_jit
def _take_turn(turns, WG: gl.constexpr, event, PINGPONG: gl.constexpr):
    """Wait until this warpgroup may issue the wgmmas of its event-th step: the other one has
    issued those of its step event - 1 (warpgroup 0; its first turn is pre-granted) or event
    (warpgroup 1). The two then alternate on the tensor cores, each one's softmax running
    under the other's MMAs (FA3's ping-pong). The waits keep them within one step of each
    other, so a barrier's phase parity never aliases."""
    if PINGPONG:
        mbarrier.wait(turns.index(WG), event & 1)


@_jit
def _pass_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - WG))


@_jit
def _attend_tiles(WG: gl.constexpr, acc, m_i, l_i, p_op, q, k_bufs, v_bufs, bars, scale_log2e,
                  q_pos, kv_end, lo, hi, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                  MASKED: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    """Key tiles lo .. hi - 1 of one consumer warpgroup. p_op holds P of tile lo - 1, whose PV
    product is still to do: each step issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}, waits for
    S_j, computes its softmax, then waits for the PV product. The code lets that softmax run
    under the PV wgmma (FA3's intra-warpgroup overlap), but ptxas (triton 3.6) packs P_j into
    the registers the loop carries, which that wgmma still reads, so it waits for the wgmma
    before the softmax. Two alternating P register sets avoid that but spill at 240 registers."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turns = bars
    s_layout: gl.constexpr = q_pos.type.layout.parent  # q_pos: a row slice of S's layout
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = p_op.type.layout
    p_dtype: gl.constexpr = p_op.dtype
    s_zero = gl.zeros([_WG_ROWS, BLOCK_N], gl.float32, layout=s_layout)
    for j in range(lo, hi):
        stage = j % NUM_STAGES
        prev = (j - 1) % NUM_STAGES
        mbarrier.wait(k_ready.index(stage), (j // NUM_STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
        _take_turn(turns, WG, j, PINGPONG)
        s = warpgroup_mma(q, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)  # fmt: skip
        acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        # wgmma groups retire in order: at most one outstanding means S_j is done.
        s = warpgroup_mma_wait(1, deps=[s])
        mbarrier.arrive(k_empty.index(stage))
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, scale_log2e, q_pos, j * BLOCK_N, kv_end,
                                           MASKED)  # fmt: skip
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
        mbarrier.arrive(v_empty.index(prev))
        acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
        p_op = gl.convert_layout(p.to(p_dtype), p_layout)
    return acc, m_i, l_i, p_op


@_jit
def _first_scores(WG: gl.constexpr, q, k_bufs, bars, s_layout: gl.constexpr,
                  BLOCK_N: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
    """S_0 = Q K_0^T of one consumer warpgroup, in its turn on the tensor cores; frees K_0's
    ring stage."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turns = bars
    mbarrier.wait(k_ready.index(0), 0)
    _take_turn(turns, WG, 0, PINGPONG)
    s = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)),
                      gl.zeros([_WG_ROWS, BLOCK_N], gl.float32, layout=s_layout),
                      use_acc=False, is_async=True)  # fmt: skip
    _pass_turn(turns, WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(k_empty.index(0))
    return s


@_jit
def _store_rows(acc, l_i, out_ptr, row0, rows, query_len, head, stride_ot, stride_oh,
                HEAD_DIM: gl.constexpr):  # fmt: skip
    """out[row0 + rows, head] = acc / l_i for the rows < query_len (the rest belong to the
    next request or to nobody)."""
    o_layout: gl.constexpr = acc.type.layout
    o = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    rows = gl.convert_layout(rows, gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    dst = (out_ptr + (row0 + rows).to(gl.int64)[:, None] * stride_ot + head * stride_oh
           + cols[None, :])  # fmt: skip
    gl.store(dst, o.to(out_ptr.dtype.element_ty), mask=(rows < query_len)[:, None])


@_jit
def _consumer(WG: gl.constexpr, bufs, bars, tile, out_ptr, scale_log2e, stride_ot, stride_oh,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
              PINGPONG: gl.constexpr):  # fmt: skip
    """One MMA warpgroup: query rows WG * 64 .. WG * 64 + 63 of the tile against key tiles
    0 .. num_tiles - 1 (the first full_tiles of them visible to every row: no masks). Its
    steps, each one turn on the tensor cores: S_0; (S_j, PV_{j-1}) for j >= 1; PV_last."""
    q_smem, k_bufs, v_bufs = bufs
    q_bar, k_ready, k_empty, v_ready, v_empty, turns = bars
    q_row, head, t0, query_len, ctx_start, kv_end, full_tiles, num_tiles = tile
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    # P feeds the PV wgmma from registers; from S's accumulator layout this is a register
    # permutation, no shared memory round trip.
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q = q_smem.slice(WG * _WG_ROWS, _WG_ROWS)
    rows = t0 + WG * _WG_ROWS + gl.arange(0, _WG_ROWS, layout=gl.SliceLayout(1, s_layout))
    q_pos = ctx_start + rows  # positions of this warpgroup's queries
    mbarrier.wait(q_bar, 0)

    # Tile 0 (always masked: cheap, once) leaves P_0 for the loops' first PV product.
    s = _first_scores(WG, q, k_bufs, bars, s_layout, BLOCK_N, PINGPONG)
    m_i = gl.full([_WG_ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([_WG_ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    p, m_i, l_i, _ = _softmax_step(s, m_i, l_i, scale_log2e, q_pos, 0, kv_end, True)
    p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    acc = gl.zeros([_WG_ROWS, HEAD_DIM], gl.float32, layout=o_layout)

    acc, m_i, l_i, p_op = _attend_tiles(
        WG, acc, m_i, l_i, p_op, q, k_bufs, v_bufs, bars, scale_log2e, q_pos, kv_end, 1,
        full_tiles, BLOCK_N, NUM_STAGES, False, PINGPONG,
    )  # fmt: skip
    acc, m_i, l_i, p_op = _attend_tiles(
        WG, acc, m_i, l_i, p_op, q, k_bufs, v_bufs, bars, scale_log2e, q_pos, kv_end,
        gl.maximum(full_tiles, 1), num_tiles, BLOCK_N, NUM_STAGES, True, PINGPONG,
    )  # fmt: skip

    last = (num_tiles - 1) % NUM_STAGES
    mbarrier.wait(v_ready.index(last), ((num_tiles - 1) // NUM_STAGES) & 1)
    _take_turn(turns, WG, num_tiles, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    acc = warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(v_empty.index(last))
    _store_rows(acc, l_i, out_ptr, q_row - t0, rows, query_len, head, stride_ot, stride_oh,
                HEAD_DIM)  # fmt: skip


@_jit
def _program(NUM_HEADS: gl.constexpr, GROUP: gl.constexpr, KV_HEAD_MAJOR: gl.constexpr):
    """(q head, query tile id) of this program; tile ids run last-first (see the kernel)."""
    pid = gl.program_id(0)
    num_q_tiles = gl.num_programs(0) // NUM_HEADS
    if KV_HEAD_MAJOR:
        kv_head = pid // (num_q_tiles * GROUP)
        rest = pid % (num_q_tiles * GROUP)
        head = kv_head * GROUP + rest % GROUP
        tile_id = num_q_tiles - 1 - rest // GROUP
    else:
        head = pid % NUM_HEADS
        tile_id = num_q_tiles - 1 - pid // NUM_HEADS
    return head, tile_id


@_jit
def _tile_rows(query_start_loc_ptr, num_seqs, start_row, tile_id):
    """(request, its first packed row, the tile's first row t0 in it, its query length): the
    program has no rows when t0 >= query_len."""
    seq, q_start, tile = _find_tile(query_start_loc_ptr, num_seqs, start_row, tile_id, _BLOCK_M)
    query_len = gl.load(query_start_loc_ptr + seq + 1) - q_start
    return seq, q_start, tile * _BLOCK_M, query_len


@_jit
def _tile_keys(seq_lens_ptr, seq, t0, query_len, BLOCK_N: gl.constexpr):
    """(position of the request's first query, keys any row of the tile sees, key tiles every
    row sees whole, key tiles in all)."""
    ctx_start = gl.load(seq_lens_ptr + seq) - query_len
    kv_end = ctx_start + gl.minimum(t0 + _BLOCK_M, query_len)
    full_tiles = (ctx_start + t0 + 1) // BLOCK_N
    return ctx_start, kv_end, full_tiles, gl.cdiv(kv_end, BLOCK_N)


@_jit
def _allocate_ring(q_desc, k_desc, v_desc, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                   NUM_STAGES: gl.constexpr):  # fmt: skip
    """Q, the K/V ring and their mbarriers in shared memory, initialized: (bufs, bars) as the
    partitions take them."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [_BLOCK_M, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)  # the producer's expect; TMA bytes complete it
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrive per consumer warpgroup
        mbarrier.init(v_empty.index(i), count=2)
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)  # see _take_turn
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)
    mbarrier.arrive(turns.index(0))  # warpgroup 0 issues first
    return (q_smem, k_bufs, v_bufs), (q_bar, k_ready, k_empty, v_ready, v_empty, turns)


# Batch-dependent integers and metadata slices must not be specialized on value or alignment,
# or every new batch shape would compile the kernel again (the kernels built on this one's
# machinery take them the same way).
BATCH_ARGS = {
    "do_not_specialize": ["num_seqs", "start_row", "stride_bt"],
    "do_not_specialize_on_alignment": ["block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"],
}


@_jit(**BATCH_ARGS)
def _gluon_prefill_kernel(
    q_desc, k_desc, v_desc, out_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale_log2e, num_seqs, start_row, stride_ot, stride_oh, stride_bt,
    NUM_HEADS: gl.constexpr, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    PINGPONG: gl.constexpr, KV_HEAD_MAJOR: gl.constexpr,
):  # fmt: skip
    """Grid ((cdiv(num_rows, 128) + num_seqs) * num_heads,): program = (q head, query tile of
    128 rows of one request); programs past a request's last tile exit at once. Tiles run
    last-first, so the longest causal tiles start first and the short ones fill the tail.
    KV_HEAD_MAJOR: the programs of one KV head run together (its GROUP q heads fastest, then
    the tiles), so the blocks resident at a time read one head's K/V, which stays in L2; else
    heads vary fastest, and at a 16k prompt the resident blocks read every head's K/V (64 MB
    at 8 KV heads of 128 dims in bf16, more than the L2)."""
    head, tile_id = _program(NUM_HEADS, GROUP, KV_HEAD_MAJOR)
    seq, q_start, t0, query_len = _tile_rows(query_start_loc_ptr, num_seqs, start_row, tile_id)
    if t0 >= query_len:
        return
    ctx_start, kv_end, full_tiles, num_tiles = _tile_keys(seq_lens_ptr, seq, t0, query_len, BLOCK_N)
    bufs, bars = _allocate_ring(q_desc, k_desc, v_desc, HEAD_DIM, BLOCK_N, NUM_STAGES)
    tile = (q_start + t0, head, t0, query_len, ctx_start, kv_end, full_tiles, num_tiles)
    block_table = block_table_ptr + seq.to(gl.int64) * stride_bt
    gl.warp_specialize(
        [
            # The default partition (the kernel's num_warps = 4) is the first consumer.
            (_consumer, (0, bufs, bars, tile, out_ptr, scale_log2e, stride_ot, stride_oh,
                         HEAD_DIM, BLOCK_N, NUM_STAGES, PINGPONG)),
            (_consumer, (1, bufs, bars, tile, out_ptr, scale_log2e, stride_ot, stride_oh,
                         HEAD_DIM, BLOCK_N, NUM_STAGES, PINGPONG)),
            (_producer, ((q_desc, k_desc, v_desc), bufs, bars, tile, block_table,
                         head // GROUP, HEAD_DIM, BLOCK_SIZE, BLOCK_N, NUM_STAGES)),
        ],
        [4, 1],  # warps of the workers: the second consumer, the producer
        [_CONSUMER_REGS, _PRODUCER_REGS],
    )  # fmt: skip


def _check_inputs(q, kv_cache, query_start_loc, seq_lens, block_tables, scale, out) -> None:
    """The Triton kernel's checks, then what this kernel supports."""
    _check_paged_inputs(q, kv_cache, query_start_loc, seq_lens, block_tables, scale, out)
    if kv_cache.dtype == FP8_KV_DTYPE:
        raise NotImplementedError("gluon_prefill_attention: fp8 KV cache (use prefill_attention)")
    if not supports(q, kv_cache):
        raise ValueError(
            "gluon_prefill_attention needs CUDA on a 9.x GPU with Gluon's Hopper API, bf16 or "
            "fp16, head_dim 64 or 128, block_size a power of two >= 8 and q's heads contiguous"
            + (f" (Gluon import failed: {GLUON_IMPORT_ERROR})" if GLUON_IMPORT_ERROR else "")
        )


_GL_DTYPES = (
    {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16} if GLUON_IMPORT_ERROR is None else {}
)


def _descriptor(t: torch.Tensor, block_shape: tuple[int, int]) -> TensorDescriptor:
    """A TMA descriptor over the 2D view t with 128-byte-swizzled boxes of block_shape, the
    shared layout wgmma reads (rows past t's end load as zeros)."""
    layout = _shared_layout(block_shape, t.dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block_shape), layout)


@functools.cache
def _shared_layout(block_shape: tuple[int, int], dtype: torch.dtype):
    """The swizzled shared layout of a box, worked out once per shape and dtype rather than
    three times a launch, a launch per layer of every large prefill step (docs/kernels.md)."""
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), _GL_DTYPES[dtype])


def _kv_head_major(programs_per_kv_head: int, device: torch.device) -> bool:
    """Run one KV head's programs together once they fill the GPU (a wave). Then the blocks
    resident at a time share one head's K/V, which stays in L2, where with heads fastest they
    would read every head's (64 MB at a 16k prompt of 8 KV heads, more than the L2). With
    fewer programs a head's long causal tiles would start late and run alone at the end
    (the measurements: docs/kernels.md)."""
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    return programs_per_kv_head >= num_sms


def launch_plan(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_n: int,
    num_seqs: int,
    kv_head_major: bool | None,
    start_row: int = 0,
) -> tuple[tuple, tuple[int], bool]:
    """What a launch of the kernels built on this one's machinery needs from the host: the TMA
    descriptors of Q (128-row boxes) and of the K and V caches (one box per cache block, at
    most block_n rows), the grid (a program per q head and 128-row tile, plus one idle tile per
    request) and the program order (`_kv_head_major`'s rule when kv_head_major is None)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    _, num_blocks, block_size, num_kv_heads, _ = kv_cache.shape
    box_n = min(block_size, block_n)
    cache_rows = num_blocks * block_size
    descs = (
        _descriptor(q.view(q.shape[0], num_heads * head_dim), (BLOCK_M, head_dim)),
        _descriptor(kv_cache[0].view(cache_rows, num_kv_heads * head_dim), (box_n, head_dim)),
        _descriptor(kv_cache[1].view(cache_rows, num_kv_heads * head_dim), (box_n, head_dim)),
    )
    grid = ((triton.cdiv(q.shape[0] - start_row, BLOCK_M) + num_seqs) * num_heads,)
    if kv_head_major is None:
        kv_head_major = _kv_head_major(grid[0] // num_kv_heads, q.device)
    return descs, grid, kv_head_major


def gluon_prefill_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    start_row: int = 0,
    *,
    block_n: int | None = None,
    num_stages: int | None = None,
    pingpong: bool = True,
    kv_head_major: bool | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """`prefill_attention`'s contract (kernels/prefill_attention.py: packed causal queries over
    their paged contexts; writes and returns out), on a cache in q's dtype with q's last two
    dims contiguous; requires `supports(q, kv_cache)`, an fp8 cache raises NotImplementedError
    (k_scale, v_scale are accepted for interface parity and must be 1). Tuning: block_n (64 or
    128) and num_stages override the table, pingpong=False lets the two consumer warpgroups
    issue their MMAs unordered, kv_head_major says whether one KV head's programs run together
    (`_kv_head_major`'s rule when None). Cache slots past a request's seq_len inside its last
    block are read (and weighted by zero), so they must hold finite values: true of the
    engine's zero-initialized cache. No host syncs.
    """
    _check_inputs(q, kv_cache, query_start_loc, seq_lens, block_tables, scale, out)
    check_kv_scales(kv_cache, k_scale, v_scale)
    num_seqs = seq_lens.shape[0]
    num_rows = q.shape[0] - start_row
    if num_seqs == 0 or num_rows <= 0:
        return out
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    cfg_n, cfg_stages = _CONFIGS[head_dim]
    block_n = block_n or cfg_n
    num_stages = num_stages or cfg_stages
    smem = q.element_size() * head_dim * (BLOCK_M + 2 * num_stages * block_n)
    if block_n not in (64, 128) or num_stages < 2 or smem > SHARED_MEMORY_LIMIT:
        raise ValueError(f"block_n must be 64 or 128 and num_stages >= 2 with Q and the K/V "
                         f"ring within {SHARED_MEMORY_LIMIT} B of shared memory: block_n "
                         f"{block_n}, num_stages {num_stages} need {smem} B")  # fmt: skip
    descs, grid, kv_head_major = launch_plan(
        q, kv_cache, block_n, num_seqs, kv_head_major, start_row
    )
    _gluon_prefill_kernel[grid](
        *descs, out, block_tables, seq_lens, query_start_loc,
        scale * LOG2E, num_seqs, start_row, out.stride(0), out.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, NUM_STAGES=num_stages, PINGPONG=pingpong,
        KV_HEAD_MAJOR=kv_head_major,
        num_warps=4,
    )  # fmt: skip
    return out
