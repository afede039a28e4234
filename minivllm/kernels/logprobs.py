"""The logprobs a request asks for, from a step's raw logits: two Triton passes.

What torch's log_softmax followed by layers/sampler.py's gather_logprobs gives (the sampled
token's logprob and rank, then the top k), without a float32 [R, V] copy of the rows and in two
launches where torch takes about ten:
1. grid (rows, chunks): each CHUNK-wide slice of a row keeps its max, its sum of exp(x - max)
   and its k largest values with their ids, in a [rows, chunks, ...] workspace;
2. grid (rows,): a row's chunks' maxima and sums give its log-sum-exp; its chunks' candidates
   give the top k; one more read of the row counts the tokens more likely than the sampled one.
Each logprob is (x - max) - log(sum), the same expression for every value, so ranks and the top
k agree with the values reported. Ties go to the lowest id. k is read at run time: one variant
a logits dtype (and with or without a list of rows), compiled at start (Sampler.compile_kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor

# The most top logprobs these kernels take: vLLM's and the engine's default max_logprobs (each
# is a pass over a slice in stage 1; the sampler takes more through torch.topk).
MAX_TOP_K = 20
# Vocab slice of one stage-1 program.
CHUNK = 4096
# Larger than any token id: the id of "no candidate".
NO_ID: tl.constexpr = tl.constexpr(2**31 - 1)


@triton.jit(do_not_specialize=["k"], do_not_specialize_on_alignment=["rows_ptr"])
def _chunk_kernel(logits_ptr, rows_ptr, max_ptr, sum_ptr, cand_val_ptr, cand_id_ptr,
                  stride_logits, vocab_size, num_chunks, k,
                  ALL_ROWS: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """Grid (num_rows, num_chunks): one slice's max, sum of exp(x - max) and k largest values
    (largest first; among equal values the lowest id first) with their ids."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    if ALL_ROWS:
        row = r.to(tl.int64)
    else:
        row = tl.load(rows_ptr + r)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_logits + cols, mask=cols < vocab_size,
                other=-float("inf")).to(tl.float32)  # fmt: skip
    top = tl.max(x, 0)
    shift = tl.where(top == -float("inf"), 0.0, top)  # a slice of -inf sums to 0, not NaN
    slot = r * num_chunks + c
    tl.store(max_ptr + slot, top)
    tl.store(sum_ptr + slot, tl.sum(tl.exp(x - shift), 0))
    # The padding past the vocabulary is -inf with the largest ids: picked after every token.
    taken = cols < 0
    for j in range(0, k):
        value = tl.max(tl.where(taken, -float("inf"), x), 0)
        pick = tl.min(tl.where((x == value) & ~taken, cols, NO_ID), 0)
        taken = taken | (cols == pick)
        tl.store(cand_val_ptr + slot * k + j, value)
        tl.store(cand_id_ptr + slot * k + j, pick)


@triton.jit(do_not_specialize=["k"], do_not_specialize_on_alignment=["rows_ptr"])
def _row_kernel(logits_ptr, rows_ptr, token_ids_ptr, max_ptr, sum_ptr, cand_val_ptr, cand_id_ptr,
                ids_out_ptr, values_out_ptr, ranks_out_ptr, stride_logits, vocab_size,
                num_chunks, k, ALL_ROWS: tl.constexpr, CHUNK: tl.constexpr,
                CHUNKS: tl.constexpr, MERGE: tl.constexpr):  # fmt: skip
    """Grid (num_rows,): a row's log-sum-exp from its chunks, its token's logprob and rank
    (1 + the tokens with a larger logprob), and its top k from the chunks' candidates."""
    r = tl.program_id(0)
    if ALL_ROWS:
        row = r.to(tl.int64)
    else:
        row = tl.load(rows_ptr + r)
    base = logits_ptr + row * stride_logits
    chunks = tl.arange(0, CHUNKS)
    maxima = tl.load(max_ptr + r * num_chunks + chunks, mask=chunks < num_chunks,
                     other=-float("inf"))  # fmt: skip
    sums = tl.load(sum_ptr + r * num_chunks + chunks, mask=chunks < num_chunks, other=0.0)
    top = tl.max(maxima, 0)
    shift = tl.where(top == -float("inf"), 0.0, top)
    log_sum = tl.log(tl.sum(sums * tl.exp(maxima - shift), 0))
    token = tl.load(token_ids_ptr + row)
    token_logprob = (tl.load(base + token).to(tl.float32) - shift) - log_sum
    width = k + 1
    tl.store(ids_out_ptr + r * width, token)
    tl.store(values_out_ptr + r * width, token_logprob)
    # The rank: one more read of the row.
    above = tl.sum(tl.zeros([CHUNK], tl.int32), 0)
    for c in range(0, num_chunks):
        cols = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(base + cols, mask=cols < vocab_size, other=-float("inf")).to(tl.float32)
        above += tl.sum(((x - shift) - log_sum > token_logprob).to(tl.int32), 0)
    tl.store(ranks_out_ptr + r, (above + 1).to(tl.int64))
    # The top k among the chunks' candidates (each chunk's k largest hold the row's).
    slots = tl.arange(0, MERGE)
    num_candidates = num_chunks * k
    values = tl.load(cand_val_ptr + r * num_candidates + slots, mask=slots < num_candidates,
                     other=-float("inf"))  # fmt: skip
    ids = tl.load(cand_id_ptr + r * num_candidates + slots, mask=slots < num_candidates,
                  other=NO_ID)  # fmt: skip
    taken = slots >= num_candidates
    for j in range(0, k):
        value = tl.max(tl.where(taken, -float("inf"), values), 0)
        pick = tl.min(tl.where((values == value) & ~taken, ids, NO_ID), 0)
        taken = taken | (ids == pick)
        tl.store(ids_out_ptr + r * width + 1 + j, pick.to(tl.int64))
        tl.store(values_out_ptr + r * width + 1 + j, (value - shift) - log_sum)


def token_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    num_logprobs: int,
    rows: torch.Tensor | None = None,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gather_logprobs(log_softmax(logits[rows]), token_ids[rows], num_logprobs) in two passes.

    logits: [N, V] fp32/fp16/bf16, raw; token_ids: [N] int64 (each row's sampled token); rows:
    [R] int64, the rows that asked (None: all N). Returns ids [R, k + 1] int64 (the token
    first, then the top k, largest first), their logprobs [R, k + 1] float32 and the token's
    rank [R] int64, k = min(num_logprobs, V). chunk: the stage-1 slice (a power of two >= 16;
    small in Triton's interpreter). No host sync.
    """
    check_tensor("logits", logits, 2)
    check_tensor("token_ids", token_ids, 1, (torch.int64,))
    num_rows, vocab_size = logits.shape
    check_same("token_ids.shape[0]", token_ids.shape[0], "logits.shape[0]", num_rows)
    if rows is not None:
        check_tensor("rows", rows, 1, (torch.int64,))
        num_rows = rows.shape[0]
    if not 0 <= num_logprobs <= MAX_TOP_K:
        raise ValueError(f"num_logprobs must be in [0, {MAX_TOP_K}], got {num_logprobs}")
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    k = min(num_logprobs, vocab_size)
    device = logits.device
    ids = torch.empty(num_rows, k + 1, dtype=torch.int64, device=device)
    values = torch.empty(num_rows, k + 1, dtype=torch.float32, device=device)
    ranks = torch.empty(num_rows, dtype=torch.int64, device=device)
    if num_rows == 0:
        return ids, values, ranks
    if vocab_size == 0:
        raise ValueError("logits has an empty vocab dim; there are no logprobs")
    chunk = min(chunk, max(triton.next_power_of_2(vocab_size), 16))
    num_chunks = triton.cdiv(vocab_size, chunk)
    maxima = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=device)
    sums = torch.empty_like(maxima)
    # At least one candidate a chunk: a pointer to no elements may not be one Triton takes.
    cand_values = torch.empty(num_rows, num_chunks, max(k, 1), dtype=torch.float32, device=device)
    cand_ids = torch.empty(num_rows, num_chunks, max(k, 1), dtype=torch.int32, device=device)
    all_rows = rows is None
    rows_arg = token_ids if all_rows else rows  # never read with ALL_ROWS
    _chunk_kernel[(num_rows, num_chunks)](
        logits, rows_arg, maxima, sums, cand_values, cand_ids, logits.stride(0), vocab_size,
        num_chunks, k, ALL_ROWS=all_rows, CHUNK=chunk, num_warps=8 if chunk >= 4096 else 4,
    )  # fmt: skip
    _row_kernel[(num_rows,)](
        logits, rows_arg, token_ids, maxima, sums, cand_values, cand_ids, ids, values, ranks,
        logits.stride(0), vocab_size, num_chunks, k, ALL_ROWS=all_rows, CHUNK=chunk,
        CHUNKS=max(triton.next_power_of_2(num_chunks), 2),
        MERGE=max(triton.next_power_of_2(num_chunks * k), 16), num_warps=4,
    )  # fmt: skip
    return ids, values, ranks
