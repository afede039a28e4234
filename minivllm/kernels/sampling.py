"""Fused sampling for plain batches (greedy or temperature-only rows): one Gumbel-max pass.
With per-row thresholds (the filters' top-k / top-p / min-p, layers/sampling_filters.py), ids
whose logit is below the row's threshold are dropped in the same pass; with penalties
(kernels/penalties.py's RowPenalties), each logit is penalized as it is read.

token = argmax_i(logits_i / T + g_i), g_i = -log(-log(u_i)), u_i = word i % 4 of
philox(seed, counter offset + i // 4); greedy rows (T = 0) take argmax_i(logits_i).
Two stages: vocab chunks in parallel, then a reduce over the chunks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor, runs_inline_ptx
from minivllm.kernels.penalties import (
    RowPenalties,
    penalized_on_read,
    row_penalty_args,
    row_slot,
)

# 1024-2048 measured best on an H200 (batch 256, vocab 151,936), greedy and random rows alike.
DEFAULT_BLOCK = 2048
# u in [U_MIN, U_MAX] keeps both logs finite; the clamp moves only 2**-31-wide tails.
U_MIN = 1e-12
U_MAX = 1.0 - 2.0**-24


@triton.jit
def _fast_log2(x, FAST: tl.constexpr):
    """log2(x) of positive finite x: one `lg2.approx` (a few ulp) on a GPU, where tl.log2 is a
    ~25-instruction polynomial; tl.log2 in the interpreter, which cannot run PTX."""
    if FAST:
        return tl.inline_asm_elementwise(
            "lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.log2(x)


@triton.jit
def _word_scores(logits_row, ids, vocab_size, scale, u, threshold, row, slot, counts_ptr,
                 prompt_ptr, rep_ptr, freq_ptr, pres_ptr, stride_table, table_width,
                 RANDOM: tl.constexpr, U_MIN: tl.constexpr, U_MAX: tl.constexpr,
                 FAST_LOG: tl.constexpr, PENALTIES: tl.constexpr):  # fmt: skip
    """Scores of one philox word's ids [BLOCK // 4] (u: their uniforms); -inf past the vocab
    and below threshold; penalized first where the row has a table slot (slot >= 0). In log2
    units: x * log2(e) / T - log2(-log2(u)) is log2(e) * (x / T + g) minus a constant, so its
    argmax is the Gumbel-max token."""
    score = tl.load(logits_row + ids, mask=ids < vocab_size, other=-float("inf")).to(tl.float32)
    if PENALTIES and slot >= 0:
        score = penalized_on_read(score, ids, row, slot, counts_ptr, prompt_ptr, rep_ptr,
                                  freq_ptr, pres_ptr, stride_table, table_width)  # fmt: skip
    score = tl.where(score >= threshold, score, -float("inf"))
    if RANDOM:
        u = tl.minimum(tl.maximum(u, U_MIN), U_MAX)
        score = score * scale - _fast_log2(-_fast_log2(u, FAST_LOG), FAST_LOG)
    return score


@triton.jit
def _chunk_best(logits_row, ids, vocab_size, scale, u0, u1, u2, u3, threshold, row, slot,
                counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr, stride_table, table_width,
                RANDOM: tl.constexpr, U_MIN: tl.constexpr, U_MAX: tl.constexpr,
                FAST_LOG: tl.constexpr, PENALTIES: tl.constexpr):  # fmt: skip
    """The best (score, lowest id) of the chunk: ids 4k + j take word j (u_j). The four words'
    scores are merged elementwise, then reduced once."""
    best = _word_scores(logits_row, ids, vocab_size, scale, u0, threshold, row, slot, counts_ptr,
                        prompt_ptr, rep_ptr, freq_ptr, pres_ptr, stride_table, table_width,
                        RANDOM, U_MIN, U_MAX, FAST_LOG, PENALTIES)  # fmt: skip
    best_id = ids
    for j in tl.static_range(1, 4):
        u = u1 if j == 1 else (u2 if j == 2 else u3)
        score = _word_scores(logits_row, ids + j, vocab_size, scale, u, threshold, row, slot,
                             counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr, stride_table,
                             table_width, RANDOM, U_MIN, U_MAX, FAST_LOG,
                             PENALTIES)  # fmt: skip
        take = score > best  # on a tie the earlier word keeps it: its id is lower
        best = tl.where(take, score, best)
        best_id = tl.where(take, ids + j, best_id)
    top = tl.max(best, 0)
    # Ties go to the lowest id, as in torch.argmax; padding is -inf, so a real id wins. A chunk
    # of padding or NaNs falls back to the last id, which keeps the id in range.
    return top, tl.min(tl.where((best == top) & (best_id < vocab_size), best_id, vocab_size - 1), 0)


# The per-row parameter tensors are views into one staging transfer (e.g. seeds and offsets as
# rows of one [2, N] tensor), so their alignment changes with the batch size: not specialized
# on it, or an odd batch would compile a second variant mid-run (a fresh server's first
# request would wait for that compile).
# So are the penalty tables' pointers. PENALTIES: a variant of its own, so that a batch without
# penalties runs the kernel without their code.
@triton.jit(do_not_specialize=["stride_table", "table_width"],
            do_not_specialize_on_alignment=["temperature_ptr", "seeds_ptr", "offsets_ptr",
                                            "thresholds_ptr", "row_slots_ptr", "counts_ptr",
                                            "prompt_ptr", "rep_ptr", "freq_ptr",
                                            "pres_ptr"])  # fmt: skip
def _chunk_max_kernel(
    logits_ptr, temperature_ptr, seeds_ptr, offsets_ptr, thresholds_ptr, chunk_scores_ptr,
    chunk_ids_ptr, stride_logits, vocab_size, num_chunks, row_slots_ptr, counts_ptr, prompt_ptr,
    rep_ptr, freq_ptr, pres_ptr, stride_table, table_width, PENALTIES: tl.constexpr,
    BLOCK: tl.constexpr, U_MIN: tl.constexpr, U_MAX: tl.constexpr, FAST_LOG: tl.constexpr,
    HAS_THRESHOLDS: tl.constexpr,
):  # fmt: skip
    """Grid (num_rows, num_chunks): the best (score, token id) of one BLOCK-wide vocab chunk.
    Philox counter k of the chunk gives 4 words, the uniforms of ids 4k, ..., 4k + 3 (one philox
    call, most of this kernel's cost, serves 4). Each word's ids are loaded and scored as their
    own vector (a stride-4 load): a [BLOCK / 4, 4] tile with the words picked by tl.where cost
    layout shuffles through shared memory."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    QUARTER: tl.constexpr = BLOCK // 4
    k = tl.arange(0, QUARTER)
    ids = chunk * BLOCK + 4 * k
    logits_row = logits_ptr + row * stride_logits
    temperature = tl.load(temperature_ptr + row)
    threshold = -float("inf")
    if HAS_THRESHOLDS:
        threshold = tl.load(thresholds_ptr + row)
    slot = row_slot(row_slots_ptr, row, PENALTIES)
    if temperature > 0.0:
        scale = 1.4426950408889634 / temperature  # log2(e) / T
        seed = tl.load(seeds_ptr + row)
        # int64 counters: philox takes them as (low, high) 32-bit words, so offsets never wrap.
        counters = tl.load(offsets_ptr + row) + chunk * QUARTER + k
        u0, u1, u2, u3 = tl.rand4x(seed, counters)
        best, best_id = _chunk_best(logits_row, ids, vocab_size, scale, u0, u1, u2, u3,
                                    threshold, row, slot, counts_ptr, prompt_ptr, rep_ptr,
                                    freq_ptr, pres_ptr, stride_table, table_width, True, U_MIN,
                                    U_MAX, FAST_LOG, PENALTIES)  # fmt: skip
    else:
        best, best_id = _chunk_best(logits_row, ids, vocab_size, 1.0, k, k, k, k, threshold, row,
                                    slot, counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr,
                                    stride_table, table_width, False, U_MIN, U_MAX,
                                    FAST_LOG, PENALTIES)  # fmt: skip
    tl.store(chunk_scores_ptr + row * num_chunks + chunk, best)
    tl.store(chunk_ids_ptr + row * num_chunks + chunk, best_id)


@triton.jit
def _reduce_kernel(
    chunk_scores_ptr, chunk_ids_ptr, out_ptr, num_chunks, CHUNKS: tl.constexpr
):  # fmt: skip
    """Grid (num_rows,): the best of a row's num_chunks candidates (CHUNKS >= num_chunks)."""
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS)
    scores = tl.load(
        chunk_scores_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=-float("inf")
    )
    # Chunks hold increasing ids, so the leftmost best chunk holds the lowest best id.
    _, best_chunk = tl.max(scores, 0, return_indices=True, return_indices_tie_break_left=True)
    token_id = tl.load(chunk_ids_ptr + row * num_chunks + best_chunk)
    tl.store(out_ptr + row, token_id.to(tl.int64))


def sample_plain(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    out: torch.Tensor | None = None,
    block: int = DEFAULT_BLOCK,
    thresholds: torch.Tensor | None = None,
    penalties: RowPenalties | None = None,
) -> torch.Tensor:
    """Samples one token id per row of logits; returns out [num_rows] int64.

    logits: [num_rows, vocab_size] fp32/fp16/bf16 (last dim contiguous); temperature: [num_rows]
    fp32 (0 = greedy: argmax, lowest id on ties); seeds, offsets: [num_rows] int64. A random
    row's noise for id i is word i % 4 of philox(seeds[row], offsets[row] + i // 4), so its
    token depends only on (logits row, temperature, seed, offset), never on the row index, the
    batch or block. The caller keeps the counter ranges [offset, offset + cdiv(vocab_size, 4))
    of rows sharing a seed disjoint. thresholds: [num_rows] or [num_rows, 1] fp32, each row
    drawn among the ids whose logit is >= its threshold (the same draw as with the others set
    to -inf), or None. penalties: kernels/penalties.py's RowPenalties, applied to each logit as
    it is read (before the thresholds), or None.
    Grids: (num_rows, cdiv(vocab_size, block)) over vocab chunks, then (num_rows,); no host sync.
    """
    check_tensor("logits", logits, 2)
    check_tensor("temperature", temperature, 1, (torch.float32,))
    check_tensor("seeds", seeds, 1, (torch.int64,))
    check_tensor("offsets", offsets, 1, (torch.int64,))
    num_rows, vocab_size = logits.shape
    for name, t in (("temperature", temperature), ("seeds", seeds), ("offsets", offsets)):
        check_same(f"{name}.shape[0]", t.shape[0], "num_rows", num_rows)
        check_same(f"{name}.device", t.device, "logits.device", logits.device)
    if thresholds is not None:
        thresholds = thresholds.reshape(-1)
        check_tensor("thresholds", thresholds, 1, (torch.float32,))
        check_same("thresholds.shape[0]", thresholds.shape[0], "num_rows", num_rows)
    if out is None:
        out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    check_tensor("out", out, 1, (torch.int64,))
    check_same("out.shape[0]", out.shape[0], "num_rows", num_rows)
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    if num_rows == 0 or vocab_size == 0:
        if vocab_size == 0 and num_rows:
            raise ValueError("logits has an empty vocab dim; there is nothing to sample")
        return out
    block = min(block, max(triton.next_power_of_2(vocab_size), 16))
    num_chunks = triton.cdiv(vocab_size, block)
    chunk_scores = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=logits.device)
    chunk_ids = torch.empty(num_rows, num_chunks, dtype=torch.int32, device=logits.device)
    _chunk_max_kernel[(num_rows, num_chunks)](
        logits, temperature, seeds, offsets, temperature if thresholds is None else thresholds,
        chunk_scores, chunk_ids, logits.stride(0), vocab_size, num_chunks,
        # PENALTIES picks the variant: without, the pointers' types do not matter.
        *row_penalty_args(penalties, num_rows, temperature, typed=False),
        PENALTIES=penalties is not None, BLOCK=block, U_MIN=U_MIN, U_MAX=U_MAX,
        FAST_LOG=runs_inline_ptx(logits),
        HAS_THRESHOLDS=thresholds is not None,
        num_warps=min(max(block // 512, 1), 8),
    )  # fmt: skip
    _reduce_kernel[(num_rows,)](
        chunk_scores, chunk_ids, out, num_chunks,
        CHUNKS=max(triton.next_power_of_2(num_chunks), 2), num_warps=1,
    )  # fmt: skip
    return out
