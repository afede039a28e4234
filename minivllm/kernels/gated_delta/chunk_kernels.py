"""The chunked gated delta rule's three passes (launched in order by `prefill.py`):

1. `_chunk_prepare_kernel` (chunk x head): cumulative decay gc, then the WY form of the
   chunk's updates: (I + A)^-1 with A[i, j] = beta_i k_i.k_j exp(gc_i - gc_j) (i > j), applied
   to beta * v (u) and to beta * k * exp(gc) (w). The inverse is float32 (on the GPU its dots
   are tf32 for 16-bit inputs: finer than the 16-bit w and u they make).
2. `_chunk_state_kernel` (sequence x head x d_v block): walks its sequence's chunks in order,
   saving the state at each chunk's start (h) and the chunk's corrected values
   v_new = u - w S, and carries S to the next chunk; writes the final state to the slot.
3. `_chunk_output_kernel` (chunk x head x d_v block): o = q exp(gc) h + (causal q k^T
   exp(gc_i - gc_j)) v_new, all chunks in parallel.

Rows past a sequence's end inside its last chunk are loaded as zeros (k, v, beta, g = 0),
which makes them write nothing. Dots take q's dtype (float32: exact "ieee" dots). The step's
metadata (tables, slots) may be slices of persistent buffers: no alignment specialization."""

from __future__ import annotations

import triton
import triton.language as tl

from minivllm.kernels.gated_delta.common import load_rows


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """a @ b, accumulated in float32; float32 operands are multiplied at PRECISION ("ieee"
    for float32 inputs, "tf32" otherwise: `prefill.py`)."""
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _unit_lower_inverse(a, BT: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 for A [BT, BT] float32, strictly lower triangular, BT = 4 * SUB: a few
    dots, no reductions (a row-by-row substitution over BT rows reduces across warps twice a
    row)."""
    tl.static_assert(BT == 4 * SUB)
    i = tl.arange(0, BT)
    eye = tl.where(i[:, None] == i[None, :], 1.0, 0.0)
    same_block = (i[:, None] // SUB) == (i[None, :] // SUB)
    a_diag = tl.where(same_block, a, 0.0)
    # D, the inverses of the SUB x SUB diagonal blocks, all at once by forward substitution:
    # step r finishes row r of every block, e_r - A[r, :] D (the rows above r are final).
    d = eye
    for r in range(1, SUB):
        d -= _dot(tl.where((i % SUB == r)[:, None], a_diag, 0.0), d, PRECISION)
    # I + A = (I + A_diag)(I + M) with M = D B, B the part of A below the diagonal blocks. M is
    # strictly block-lower (M^4 = 0), so (I + M)^-1 = (I - M)(I + M^2).
    m = _dot(d, tl.where(same_block, 0.0, a), PRECISION)
    return _dot(_dot(eye - m, eye + _dot(m, m, PRECISION), PRECISION), d, PRECISION)


@triton.jit
def _chunk_rows(chunk_table_ptr, cu_seqlens_ptr, chunk, BT: tl.constexpr):
    """The chunk's sequence, token rows [BT] and which of them are real."""
    seq = tl.load(chunk_table_ptr + 2 * chunk)
    first = tl.load(chunk_table_ptr + 2 * chunk + 1)
    rows = first + tl.arange(0, BT)
    return seq, rows, rows < tl.load(cu_seqlens_ptr + seq + 1)


@triton.jit(do_not_specialize_on_alignment=["chunk_table_ptr", "cu_seqlens_ptr"])
def _chunk_prepare_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, gc_ptr, w_ptr, u_ptr, chunk_table_ptr, cu_seqlens_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_bt,
    HEADS_PER_K: tl.constexpr, H_V: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid (num_chunks, H_v). Writes gc [T, H_v] float32 and w [T, H_v, d_k],
    u [T, H_v, d_v] (contiguous, the op dtype)."""
    chunk = tl.program_id(0)
    head = tl.program_id(1)
    _, rows, ok = _chunk_rows(chunk_table_ptr, cu_seqlens_ptr, chunk, BT)
    rows64 = rows.to(tl.int64)
    cols_k = tl.arange(0, BK)
    cols_v = tl.arange(0, BV)
    g = tl.load(g_ptr + rows64 * stride_gt + head, mask=ok, other=0.0).to(tl.float32)
    gc = tl.cumsum(g, 0)
    tl.store(gc_ptr + rows64 * H_V + head, gc, mask=ok)
    beta = tl.load(beta_ptr + rows64 * stride_bt + head, mask=ok, other=0.0).to(tl.float32)
    k = load_rows(k_ptr + (head // HEADS_PER_K) * stride_kh, rows, ok, stride_kt, cols_k,
                  cols_k < D_K, L2NORM)  # fmt: skip
    v = load_rows(v_ptr + head * stride_vh, rows, ok, stride_vt, cols_v, cols_v < D_V, False)
    op = w_ptr.dtype.element_ty
    kb = (k * beta[:, None]).to(op)
    i = tl.arange(0, BT)
    lower = i[:, None] > i[None, :]
    decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], float("-inf")))
    a = _dot(kb, tl.trans(k.to(op)), PRECISION) * decay  # strictly lower: 0 on and above
    inv = _unit_lower_inverse(a, BT, BT // 4, PRECISION).to(op)
    w = _dot(inv, (k * (beta * tl.exp(gc))[:, None]).to(op), PRECISION)
    u = _dot(inv, (v * beta[:, None]).to(op), PRECISION)
    w_offs = (rows64[:, None] * H_V + head) * D_K + cols_k[None, :]
    tl.store(w_ptr + w_offs, w.to(op), mask=ok[:, None] & (cols_k < D_K)[None, :])
    u_offs = (rows64[:, None] * H_V + head) * D_V + cols_v[None, :]
    tl.store(u_ptr + u_offs, u.to(op), mask=ok[:, None] & (cols_v < D_V)[None, :])


@triton.jit(do_not_specialize_on_alignment=["cu_seqlens_ptr", "cu_chunks_ptr", "slots_ptr",
                                            "has_init_ptr"])  # fmt: skip
def _chunk_state_kernel(
    k_ptr, gc_ptr, w_ptr, u_ptr, h_ptr, v_new_ptr, state_ptr, cu_seqlens_ptr, cu_chunks_ptr,
    slots_ptr, has_init_ptr, stride_kt, stride_kh, stride_ss, stride_sh,
    HEADS_PER_K: tl.constexpr, H_V: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid (num_seqs, H_v, cdiv(d_v, BV)). Writes h [num_chunks, H_v, d_k, d_v] and
    v_new [T, H_v, d_v] (the op dtype) and the final state (float32) at the slot."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    cols_v = tl.program_id(2) * BV + tl.arange(0, BV)
    cols_k = tl.arange(0, BK)
    vmask = cols_v < D_V
    kmask = cols_k < D_K
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    first_chunk = tl.load(cu_chunks_ptr + seq)
    last_chunk = tl.load(cu_chunks_ptr + seq + 1)
    s_offs = tl.load(slots_ptr + seq).to(tl.int64) * stride_ss + head * stride_sh
    s_offs += cols_k[:, None] * D_V + cols_v[None, :]
    s_mask = kmask[:, None] & vmask[None, :]
    # (A scalar bool cannot mask a tile in the interpreter: the row limits carry the flags.)
    init_rows = tl.where(tl.load(has_init_ptr + seq) != 0, D_K, 0)
    s = tl.load(state_ptr + s_offs, mask=s_mask & (cols_k < init_rows)[:, None], other=0.0)
    op = w_ptr.dtype.element_ty
    h_ptr += (first_chunk.to(tl.int64) * H_V + head) * D_K * D_V  # the first chunk's h
    for chunk in range(first_chunk, last_chunk):
        chunk_start = start + (chunk - first_chunk) * BT
        rows = chunk_start + tl.arange(0, BT)
        ok = rows < end
        rows64 = rows.to(tl.int64)
        tl.store(h_ptr + cols_k[:, None] * D_V + cols_v[None, :], s.to(op), mask=s_mask)
        h_ptr += H_V * D_K * D_V
        w = load_rows(w_ptr + head * D_K, rows, ok, H_V * D_K, cols_k, kmask, False)
        u = load_rows(u_ptr + head * D_V, rows, ok, H_V * D_V, cols_v, vmask, False)
        v_new = u - _dot(w.to(op), s.to(op), PRECISION)  # what S does not already predict
        v_offs = (rows64[:, None] * H_V + head) * D_V + cols_v[None, :]
        tl.store(v_new_ptr + v_offs, v_new.to(op), mask=ok[:, None] & vmask[None, :])
        gc = tl.load(gc_ptr + rows64 * H_V + head, mask=ok, other=0.0)
        g_last = tl.load(gc_ptr + (tl.minimum(end, chunk_start + BT) - 1).to(tl.int64) * H_V + head)
        k = load_rows(k_ptr + (head // HEADS_PER_K) * stride_kh, rows, ok, stride_kt, cols_k,
                      kmask, L2NORM)  # fmt: skip
        k_decayed = (k * tl.exp(g_last - gc)[:, None]).to(op)
        s = s * tl.exp(g_last) + _dot(tl.trans(k_decayed), v_new.to(op), PRECISION)
    # An empty sequence (no chunks) leaves its slot alone.
    final_rows = tl.where(last_chunk > first_chunk, D_K, 0)
    tl.store(state_ptr + s_offs, s, mask=s_mask & (cols_k < final_rows)[:, None])


@triton.jit(do_not_specialize_on_alignment=["chunk_table_ptr", "cu_seqlens_ptr"])
def _chunk_output_kernel(
    q_ptr, k_ptr, gc_ptr, h_ptr, v_new_ptr, out_ptr, chunk_table_ptr, cu_seqlens_ptr, scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
    HEADS_PER_K: tl.constexpr, H_V: tl.constexpr, D_K: tl.constexpr, D_V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid (num_chunks, H_v, cdiv(d_v, BV)). Writes out [T, H_v, d_v]: the read of the
    state at the chunk's start plus the chunk's own causal, decayed attention."""
    chunk = tl.program_id(0)
    head = tl.program_id(1)
    cols_v = tl.program_id(2) * BV + tl.arange(0, BV)
    cols_k = tl.arange(0, BK)
    vmask = cols_v < D_V
    kmask = cols_k < D_K
    _, rows, ok = _chunk_rows(chunk_table_ptr, cu_seqlens_ptr, chunk, BT)
    rows64 = rows.to(tl.int64)
    head_k = head // HEADS_PER_K
    q = load_rows(q_ptr + head_k * stride_qh, rows, ok, stride_qt, cols_k, kmask, L2NORM) * scale
    k = load_rows(k_ptr + head_k * stride_kh, rows, ok, stride_kt, cols_k, kmask, L2NORM)
    gc = tl.load(gc_ptr + rows64 * H_V + head, mask=ok, other=0.0)
    op = h_ptr.dtype.element_ty
    i = tl.arange(0, BT)
    # Rows past the end (gc 0) are left out: exp(0 - gc_j) would overflow.
    causal = (i[:, None] >= i[None, :]) & ok[:, None]
    decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], float("-inf")))
    attn = _dot(q.to(op), tl.trans(k.to(op)), PRECISION) * decay
    h_offs = (chunk.to(tl.int64) * H_V + head) * D_K * D_V
    h = tl.load(h_ptr + h_offs + cols_k[:, None] * D_V + cols_v[None, :],
                mask=kmask[:, None] & vmask[None, :], other=0.0)  # fmt: skip
    v_new = load_rows(v_new_ptr + head * D_V, rows, ok, H_V * D_V, cols_v, vmask, False)
    o = _dot((q * tl.exp(gc)[:, None]).to(op), h, PRECISION)
    o += _dot(attn.to(op), v_new.to(op), PRECISION)
    o_offs = rows64[:, None] * stride_ot + head * stride_oh + cols_v[None, :]
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=ok[:, None] & vmask[None, :])
