"""Top-k, top-p and min-p thresholds without a vocabulary sort: two Triton passes.

The filters' semantics are layers/sampling_filters.py's (each row keeps the logits at or above
one threshold); this finds the same thresholds where every row's top-k is at most
MAX_TOP_K:
1. grid (rows, chunks): each CHUNK-wide slice of a row keeps its KB largest values
   (KB: the smallest of CANDIDATE_WIDTHS >= the largest top-k), sorted, in a [rows, chunks,
   KB] workspace; at KB 32 it sorts only the KB groups of 16 with the largest maxima (an
   eighth of the slice: the sort is what this pass spends its time on);
2. grid (rows,): a row's chunks' candidates are sorted together; the k-th largest is the
   top-k threshold, and top-p's mass is summed over the candidates at or above it. Tokens tied
   with the k-th past the candidates (kept by top-k, part of the mass) exist only in a chunk
   whose KB-th candidate is itself >= the k-th; only such chunks are read again to count them.
One read of the logits (and a few KiB a row), where torch.topk makes several radix passes with
one block a row: much faster at small batches, where a decode step is short. Which filters a
row uses is read per row at run time, so an engine compiles two variants a logits dtype (one
a candidate width), all at start (Sampler.compile_kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.penalties import (
    RowPenalties,
    penalized_on_read,
    row_penalty_args,
    row_slot,
)

# The largest top-k these kernels take (the merge sorts chunks x KB candidates in one program).
MAX_TOP_K = 256
# Candidates a chunk keeps: the first width >= the step's largest top-k.
CANDIDATE_WIDTHS = (32, MAX_TOP_K)
# Vocab slice of one stage-1 program; grown so that a row's candidates stay within MAX_MERGE.
CHUNK = 4096
MAX_MERGE = 8192
# Stage 1's groups for 16-bit logits: 256 groups of 16 in a chunk of 4,096 (group_width).
GROUP_WIDTH = 16


@triton.jit
def _read(row_ptr, ids, vocab_size, row, slot, counts_ptr, prompt_ptr, rep_ptr, freq_ptr,
          pres_ptr, stride_table, table_width):  # fmt: skip
    """The row's logits at ids as float32 (-inf past the vocabulary), penalized where the row
    has a table slot (slot >= 0)."""
    x = tl.load(row_ptr + ids, mask=ids < vocab_size, other=-float("inf")).to(tl.float32)
    if slot >= 0:
        x = penalized_on_read(x, ids, row, slot, counts_ptr, prompt_ptr, rep_ptr, freq_ptr,
                              pres_ptr, stride_table, table_width)  # fmt: skip
    return x


@triton.jit
def _group_keys(group_max, KB: tl.constexpr, NUM_GROUPS: tl.constexpr, BIT_KEYS: tl.constexpr):
    """[NUM_GROUPS] int32 keys whose KB largest are groups with the KB largest maxima, the
    group's index in the low bits. BIT_KEYS (16-bit values, which leave float32's low byte
    zero): the maxima's bits with the index in the low byte, one sort. Else the KB-th largest
    maximum first, then (above it, tied with it, below) with the index."""
    index = tl.arange(0, NUM_GROUPS)
    if BIT_KEYS:
        bits = group_max.to(tl.int32, bitcast=True)
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed-int order = float order
        keys = (ordered & ~(NUM_GROUPS - 1)) | index
    else:
        kth_max = tl.min(tl.topk(group_max, KB), 0)
        rank = tl.where(group_max > kth_max, 2, tl.where(group_max == kth_max, 1, 0))
        keys = rank * NUM_GROUPS + index
    return keys


# A step's penalty tables and rows (kernels/penalties.py's RowPenalties) sit at any offset of
# its upload or are stand-ins where no row is penalized: neither specialized on.
@triton.jit(do_not_specialize=["stride_table", "table_width", "has_penalties"],
            do_not_specialize_on_alignment=["row_slots_ptr", "counts_ptr", "prompt_ptr",
                                            "rep_ptr", "freq_ptr", "pres_ptr"])  # fmt: skip
def _chunk_top_kernel(logits_ptr, cand_ptr, stride_logits, vocab_size, num_chunks,
                      row_slots_ptr, counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr,
                      stride_table, table_width, has_penalties,
                      CHUNK: tl.constexpr, KB: tl.constexpr, GROUP: tl.constexpr,
                      BIT_KEYS: tl.constexpr):  # fmt: skip
    """Grid (num_rows, num_chunks): the KB largest values of one chunk, descending.

    GROUP > 0: the chunk's GROUP-wide groups' maxima pick KB groups with the largest, and only
    those KB * GROUP values are sorted: a value of the chunk's top KB lies in such a group (else
    KB groups each hold a larger or equal one), so the KB largest values are the same (among
    groups tied at the KB-th maximum any will do: each brings that value). BIT_KEYS (16-bit
    logits): _group_keys' one sort, but for a penalized row, whose values are float32's.
    GROUP 0: the whole chunk."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row * stride_logits
    slot = row_slot(row_slots_ptr, row, has_penalties)
    ids = chunk * CHUNK + tl.arange(0, CHUNK)
    x = _read(row_ptr, ids, vocab_size, row, slot, counts_ptr, prompt_ptr, rep_ptr, freq_ptr,
              pres_ptr, stride_table, table_width)  # fmt: skip
    if GROUP == 0:
        top = tl.topk(x, KB)
    else:
        NUM_GROUPS: tl.constexpr = CHUNK // GROUP
        group_max = tl.max(tl.reshape(x, [NUM_GROUPS, GROUP]), 1)
        if BIT_KEYS:
            if slot >= 0:
                keys = _group_keys(group_max, KB, NUM_GROUPS, False)
            else:
                keys = _group_keys(group_max, KB, NUM_GROUPS, True)
        else:
            keys = _group_keys(group_max, KB, NUM_GROUPS, False)
        groups = tl.topk(keys, KB) & (NUM_GROUPS - 1)  # [KB] group indices
        picked = chunk * CHUNK + groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        values = _read(row_ptr, picked, vocab_size, row, slot, counts_ptr, prompt_ptr, rep_ptr,
                       freq_ptr, pres_ptr, stride_table, table_width)  # fmt: skip
        top = tl.topk(tl.reshape(values, [KB * GROUP]), KB)
    tl.store(cand_ptr + (row * num_chunks + chunk) * KB + tl.arange(0, KB), top)


def group_width(chunk: int, kb: int, group: int | None = None) -> int:
    """The stage-1 group width for a chunk: GROUP_WIDTH (or `group`) where the chunk holds more
    than kb groups of it, of at most 256 (the low byte of a key); else 0 (the whole chunk)."""
    group = GROUP_WIDTH if group is None else group
    num_groups = chunk // group
    return group if kb < num_groups <= 256 else 0


@triton.jit
def _ties_past_candidates(logits_row, cand_row, vocab_size, num_chunks, kth, row, slot,
                          counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr, stride_table,
                          table_width, CHUNK: tl.constexpr, KB: tl.constexpr):  # fmt: skip
    """How many logits equal to kth no chunk's candidates hold: only a chunk whose KB-th
    candidate is >= kth can hold more (then they are all == kth, as at most k - 1 <= KB - 1
    logits are > kth)."""
    extra = 0
    for chunk in range(num_chunks):
        if tl.load(cand_row + chunk * KB + KB - 1) >= kth:
            ids = chunk * CHUNK + tl.arange(0, CHUNK)
            x = _read(logits_row, ids, vocab_size, row, slot, counts_ptr, prompt_ptr, rep_ptr,
                      freq_ptr, pres_ptr, stride_table, table_width)  # fmt: skip
            extra += tl.sum((x >= kth).to(tl.int32), 0) - KB
    return extra


# The per-row parameters are views into one staging transfer (any alignment), and the has_*
# flags are plain ints: neither is specialized on, so no batch compiles a variant mid-run.
@triton.jit(do_not_specialize=["has_top_k", "has_top_p", "has_min_p", "stride_table",
                                "table_width", "has_penalties"],
            do_not_specialize_on_alignment=["temperature_ptr", "top_k_ptr", "top_p_ptr",
                                            "min_p_ptr", "row_slots_ptr", "counts_ptr",
                                            "prompt_ptr", "rep_ptr", "freq_ptr",
                                            "pres_ptr"])  # fmt: skip
def _threshold_kernel(
    logits_ptr, cand_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr,
    stride_logits, vocab_size, num_chunks, has_top_k, has_top_p, has_min_p,
    row_slots_ptr, counts_ptr, prompt_ptr, rep_ptr, freq_ptr, pres_ptr, stride_table,
    table_width, has_penalties,
    CHUNK: tl.constexpr, KB: tl.constexpr, MERGE: tl.constexpr,
):  # fmt: skip
    """Grid (num_rows,): the row's threshold from its num_chunks x KB candidates; a has_*
    flag 0 leaves that filter (and its pointer) out."""
    row = tl.program_id(0).to(tl.int64)
    num_candidates = num_chunks * KB
    cand_row = cand_ptr + row * num_candidates
    offs = tl.arange(0, MERGE)
    values = tl.load(cand_row + offs, mask=offs < num_candidates, other=-float("inf"))
    values = tl.sort(values, descending=True)
    top = tl.max(values, 0)
    temperature = tl.load(temperature_ptr + row)
    temperature = tl.where(temperature == 0.0, 1.0, temperature)  # greedy rows: as T = 1
    kth = -float("inf")
    if has_top_k != 0:
        k = tl.load(top_k_ptr + row)
        position = tl.minimum(tl.maximum(k, 1), vocab_size) - 1
        kth = tl.where(k > 0, tl.max(tl.where(offs == position, values, -float("inf")), 0),
                       -float("inf"))  # fmt: skip
    threshold = kth
    if has_top_p != 0:
        top_p = tl.load(top_p_ptr + row)
        scaled = values / temperature
        in_top_k = values >= kth
        weights = tl.where(in_top_k, tl.exp(scaled - top / temperature), 0.0)
        total = tl.sum(weights, 0)
        if (top_p < 1.0) & (kth > -float("inf")):
            slot = row_slot(row_slots_ptr, row, has_penalties)
            ties = _ties_past_candidates(logits_ptr + row * stride_logits, cand_row, vocab_size,
                                         num_chunks, kth, row, slot, counts_ptr, prompt_ptr,
                                         rep_ptr, freq_ptr, pres_ptr, stride_table, table_width,
                                         CHUNK, KB)  # fmt: skip
            total += ties.to(tl.float32) * tl.exp(kth / temperature - top / temperature)
        # A token stays while the more likely ones before it hold < top_p of the mass; the
        # kept candidates are a prefix, the threshold its last value.
        mass_before = tl.cumsum(weights, 0) - weights
        keep = ((mass_before < top_p * total) & in_top_k) | (offs == 0)
        last = tl.sum(keep.to(tl.int32), 0) - 1
        by_mass = tl.max(tl.where(offs == last, values, -float("inf")), 0)
        threshold = tl.where(top_p >= 1.0, kth, by_mass)
    if has_min_p != 0:
        # p / p_max >= min_p  <=>  x >= x_max + T * log(min_p)
        threshold = tl.maximum(threshold, top + temperature * tl.log(tl.load(min_p_ptr + row)))
    tl.store(out_ptr + row, threshold)


def merge_shape(vocab_size: int, max_top_k: int, chunk: int = CHUNK) -> tuple[int, int, int]:
    """(chunk, kb, merge): the stage-1 slice (at least `chunk`), candidates a chunk, and the
    merge's width."""
    kb = next(width for width in CANDIDATE_WIDTHS if width >= max_top_k)
    chunk = min(chunk, triton.next_power_of_2(max(vocab_size, 1)))  # a small vocab: one slice
    chunk = max(chunk, kb, triton.next_power_of_2(triton.cdiv(vocab_size * kb, MAX_MERGE)))
    merge = max(triton.next_power_of_2(triton.cdiv(vocab_size, chunk) * kb), 16)
    return chunk, kb, merge


def filter_thresholds(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    max_top_k: int,
    chunk: int = CHUNK,
    group: int | None = None,
    penalties: RowPenalties | None = None,
) -> torch.Tensor:
    """[num_rows, 1] float32: each row keeps the logits >= its threshold (-inf: all).

    logits: [num_rows, vocab_size] fp32/fp16/bf16 (not divided by temperature; penalized, or
    penalized as read: penalties, kernels/penalties.py's RowPenalties, or None);
    temperature [num_rows] fp32 (0 read as 1); top_k [num_rows] int64 (0 = off, each <=
    max_top_k <= MAX_TOP_K), top_p [num_rows] fp32 (1 = off; a row with top_p < 1 has a
    top_k), min_p [num_rows] fp32 (0 = off); each None when no row uses it. chunk: the
    stage-1 slice (a power of two; small in Triton's interpreter); group: stage 1's group
    width where it groups (group_width; a power of two). No host sync.
    """
    check_tensor("logits", logits, 2)
    num_rows, vocab_size = logits.shape
    if not 0 <= max_top_k <= MAX_TOP_K:
        raise ValueError(f"max_top_k must be in [0, {MAX_TOP_K}], got {max_top_k}")
    if top_p is not None and top_k is None:
        raise ValueError("top_p needs top_k here (the mass is summed over top-k candidates)")
    params = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    for name, t in params.items():
        if t is not None:
            dtypes = (torch.int64,) if name == "top_k" else (torch.float32,)
            check_tensor(name, t, 1, dtypes)
            check_same(f"{name}.shape[0]", t.shape[0], "num_rows", num_rows)
    out = torch.empty(num_rows, 1, dtype=torch.float32, device=logits.device)
    if num_rows == 0 or vocab_size == 0:
        return out.fill_(-torch.inf)
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    if group is not None and (group < 1 or group & (group - 1)):
        raise ValueError(f"group must be a power of two >= 1, got {group}")
    chunk, kb, merge = merge_shape(vocab_size, max_top_k, chunk)
    num_chunks = triton.cdiv(vocab_size, chunk)
    candidates = torch.empty(num_rows, num_chunks, kb, dtype=torch.float32, device=logits.device)
    pen = (*row_penalty_args(penalties, num_rows, temperature), int(penalties is not None))
    _chunk_top_kernel[(num_rows, num_chunks)](
        logits, candidates, logits.stride(0), vocab_size, num_chunks, *pen, CHUNK=chunk, KB=kb,
        GROUP=group_width(chunk, kb, group), BIT_KEYS=logits.dtype != torch.float32,
        num_warps=8,
    )  # fmt: skip
    _threshold_kernel[(num_rows,)](
        logits, candidates, temperature, *(temperature if t is None else t for t in
                                           (top_k, top_p, min_p)),
        out, logits.stride(0), vocab_size, num_chunks,
        int(top_k is not None), int(top_p is not None), int(min_p is not None), *pen,
        CHUNK=chunk, KB=kb, MERGE=merge, num_warps=4 if merge <= 2048 else 8,
    )  # fmt: skip
    return out
