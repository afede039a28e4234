"""batch_invariant_attention: close to a torch oracle, and bit-identical for a token whatever
path computes it (one prefill chunk, other chunkings, a decode in any batch, split or not),
with decode launches on smaller tiles than prefill launches (only BLOCK_N is shared), and
segment lengths that follow each row's own position (the segment rule and its kernel twin)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from ordered_dot import ordered_dot  # noqa: F401 (fixture)
from paged_case import DEVICE, make_paged_case, ref_attention, tolerance

from minivllm.kernels.attention_segments import SEGMENTS, SegmentRule, segment_len
from minivllm.kernels.batch_invariant_attention import batch_invariant_attention

CONFIG = (32, 16, 4, 1)  # prefill tiles: block_m 32 (16 tokens x group 2), block_n 16
DECODE_CONFIG = (16, 16, 2, 1)  # decode tiles: the group padded to 16 rows, fewer warps
# Segments of 16 keys up to 32, 32 up to 64, 64 beyond (3 and more past 128): several lengths
# and the cap within tiny contexts.
RULE = SegmentRule(min_len=16, per_row=2, max_len=64)
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 32, 8


def _qsl(lens: list[int], start: int = 0) -> torch.Tensor:
    starts = [start]
    for n in lens:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32, device=DEVICE)


def _varlen(q, case, query_lens, seq_lens, block_tables, start_row=0):
    out = torch.full_like(q, float("nan"))
    return batch_invariant_attention(
        q, case.kv_cache, _qsl(query_lens, start_row),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), block_tables,
        HEAD_DIM**-0.5, out, start_row=start_row, segments=RULE, config=CONFIG,
    )  # fmt: skip


def _decode(q, case, seq_lens, block_tables, split: bool):
    """One decode row per entry of seq_lens (rows of q in order)."""
    n = len(seq_lens)
    out = torch.full_like(q, float("nan"))
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    num_segments = RULE.max_count(max(seq_lens)) + 1 if split else 0  # one spare: must exit
    parts = {}
    if split:
        shape = (n, NUM_HEADS, num_segments)
        parts = {
            "part_acc": torch.empty(*shape, HEAD_DIM, device=DEVICE),
            "part_m": torch.empty(*shape, device=DEVICE),
            "part_l": torch.empty(*shape, device=DEVICE),
        }
    return batch_invariant_attention(
        q, case.kv_cache, _qsl([1] * n), lens, block_tables, HEAD_DIM**-0.5, out,
        num_segments=num_segments, segments=RULE, config=DECODE_CONFIG, decode_rows=True,
        **parts,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference_ragged(dtype):
    seq_lens, query_lens = [1, 17, 40, 75, 33], [1, 17, 9, 70, 1]  # prefix hits, chunks
    case = make_paged_case(seq_lens, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(sum(query_lens) + 3, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
    q = q.to(DEVICE)
    out = _varlen(q, case, query_lens, seq_lens, case.block_tables, start_row=3)
    starts = _qsl(query_lens, 3).tolist()
    for i, (k, v) in enumerate(case.contexts):
        rows = slice(starts[i], starts[i + 1])
        expected = ref_attention(q[rows], k, v, HEAD_DIM**-0.5)
        torch.testing.assert_close(out[rows].cpu().float(), expected, **tolerance(dtype))
    assert torch.isnan(out[:3]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.usefixtures("ordered_dot")
def test_same_bits_prefill_chunks_and_decodes(dtype):
    """Request 0 (70 tokens: segments of 16, 32 and 64 keys) next to a neighbour: every
    token's row is the same bits from one prefill, from chunked prefills (whose tiles straddle
    the changes of segment length), and from decodes (split or not)."""
    length, other = 70, 45
    case = make_paged_case([length, other], NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    q_other = torch.randn(other, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    table = case.block_tables

    whole = _varlen(q, case, [length], [length], table[:1])
    # Chunked, each chunk batched after some rows of the neighbour (shifts tiles and rows).
    for cuts in ([0, 23, 50, 70], [0, 1, 9, 40, 70]):
        for a, b in zip(cuts, cuts[1:], strict=False):
            batch_q = torch.cat([q_other[:5], q[a:b]])
            got = _varlen(batch_q, case, [5, b - a], [5, b], table.flip(0))
            assert torch.equal(got[5:], whole[a:b]), f"chunk {a}:{b}"
    # Positions at tile and segment edges as decode rows, in one batch with a neighbour's
    # decode, split or not; and alone.
    positions = [0, 15, 16, 31, 32, 33, 63, 64, 69]
    seq_lens = [p + 1 for p in positions] + [other]
    rows = torch.cat([q[positions], q_other[-1:]])
    tables = torch.cat([table[:1].expand(len(positions), -1), table[1:]])
    for split in (False, True):
        got = _decode(rows, case, seq_lens, tables, split)
        assert torch.equal(got[: len(positions)], whole[positions]), f"decode split={split}"
        got = _decode(q[33:34], case, [34], table[:1], split)
        assert torch.equal(got[0], whole[33])


@pytest.mark.usefixtures("ordered_dot")
def test_split_fold_of_ten_segments_equals_the_walk():
    """Rows of up to 10 segments of 16 keys (the fold kernel's longest loop here) split, and
    the same rows in one prefill."""
    rule = SegmentRule(min_len=16, per_row=1, max_len=16)
    length = 150
    assert rule.max_count(length) == 10
    case = make_paged_case([length], NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, torch.float32)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=gen).to(DEVICE)
    whole = batch_invariant_attention(
        q, case.kv_cache, _qsl([length]), case.seq_lens, case.block_tables, HEAD_DIM**-0.5,
        torch.empty_like(q), segments=rule, config=CONFIG,
    )  # fmt: skip
    positions = [0, 15, 16, 127, 128, 129, 143, 144, 149]
    n = len(positions)
    segs = rule.max_count(length)
    shape = (n, NUM_HEADS, segs)
    got = batch_invariant_attention(
        q[positions].contiguous(), case.kv_cache, _qsl([1] * n),
        torch.tensor([p + 1 for p in positions], dtype=torch.int32, device=DEVICE),
        case.block_tables.expand(n, -1).contiguous(), HEAD_DIM**-0.5,
        torch.empty(n, NUM_HEADS, HEAD_DIM, device=DEVICE), num_segments=segs,
        part_acc=torch.empty(*shape, HEAD_DIM, device=DEVICE),
        part_m=torch.empty(shape, device=DEVICE), part_l=torch.empty(shape, device=DEVICE),
        segments=rule, config=DECODE_CONFIG, decode_rows=True,
    )  # fmt: skip
    assert torch.equal(got, whole[positions])


@triton.jit
def _segment_len_kernel(
    ctx_ptr, out_ptr, n, MIN_LEN: tl.constexpr, PER_ROW: tl.constexpr, MAX_LEN: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ctx = tl.load(ctx_ptr + offs, mask=mask, other=1)
    tl.store(out_ptr + offs, segment_len(ctx, MIN_LEN, PER_ROW, MAX_LEN), mask=mask)


@pytest.mark.parametrize("rule", [SEGMENTS, RULE, SegmentRule(16, 3, 256), SegmentRule(32, 1, 32)])
def test_segment_rule(rule):
    """A row's segments are the shortest min_len * 2^k keys (capped at max_len) that make at
    most per_row of them; max_count bounds every shorter row's count (the split grid); the
    kernel's twin gives the same lengths, also for contexts far past any max_model_len."""
    ctxs = list(range(1, 3 * rule.max_len * rule.per_row + 1))
    lengths = [rule.min_len << k for k in range(20) if rule.min_len << k <= rule.max_len]
    most = 0
    for ctx in ctxs:
        fits = [n for n in lengths if -(-ctx // n) <= rule.per_row]
        assert rule.length(ctx) == (fits[0] if fits else rule.max_len), ctx
        most = max(most, -(-ctx // rule.length(ctx)))
        assert rule.max_count(ctx) == most, ctx
    ctxs += [2**20 + 1, 2**30, 2**31 - 1]
    t = torch.tensor(ctxs, dtype=torch.int32, device=DEVICE)
    got = torch.zeros_like(t)
    args = (rule.min_len, rule.per_row, rule.max_len)
    _segment_len_kernel[(triton.cdiv(len(ctxs), 1024),)](t, got, len(ctxs), *args, BLOCK=1024)
    assert got.tolist() == [rule.length(c) for c in ctxs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.usefixtures("ordered_dot")
def test_segment_length_changes_inside_a_tile(dtype):
    """A 150-token request prefilled after a 5-token prefix hit: its 16-token tiles straddle
    the changes of segment length (between positions 31|32, 63|64 and 127|128), so one tile
    folds some rows and not others; rows past 128 have three 64-key segments (the cap). Every
    row has the same bits as the same token in one prefill and as a decode in a batch whose
    rows have 1, 2 or 3 segments of 16, 32 or 64 keys (walked or split), and is close to
    the oracle."""
    length, prefix = 150, 5
    case = make_paged_case([length], NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, seed=4)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype).to(DEVICE)
    table = case.block_tables
    whole = _varlen(q, case, [length], [length], table)
    k, v = case.contexts[0]
    expected = ref_attention(q, k, v, HEAD_DIM**-0.5)
    torch.testing.assert_close(whole.cpu().float(), expected, **tolerance(dtype))
    chunk = _varlen(q[prefix:], case, [length - prefix], [length], table)
    assert torch.equal(chunk, whole[prefix:])
    # The ends of the straddling tiles (q_pos 21-36, 53-68, 117-132) and their neighbours, in
    # a mixed order.
    positions = [64, 0, 132, 31, 117, 149, 36, 128, 21, 63, 53, 127, 32, 68, 20]
    tables = table.expand(len(positions), -1)
    for split in (False, True):
        got = _decode(q[positions], case, [p + 1 for p in positions], tables, split)
        assert torch.equal(got, whole[positions]), f"decode split={split}"


def test_split_and_decode_launches_reject_prefill_rows():
    case = make_paged_case([10], NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, torch.float32)
    q = torch.zeros(4, NUM_HEADS, HEAD_DIM, device=DEVICE)
    scratch = torch.empty(4, NUM_HEADS, 1, device=DEVICE)
    with pytest.raises(ValueError, match="decode rows only"):
        batch_invariant_attention(
            q, case.kv_cache, _qsl([4]), case.seq_lens, case.block_tables, 0.1, q.clone(),
            num_segments=1, part_acc=scratch[..., None].expand(-1, -1, -1, HEAD_DIM),
            part_m=scratch, part_l=scratch, segments=RULE, config=CONFIG,
        )  # fmt: skip
    with pytest.raises(ValueError, match="decode rows only"):
        batch_invariant_attention(
            q, case.kv_cache, _qsl([4]), case.seq_lens, case.block_tables, 0.1, q.clone(),
            segments=RULE, config=DECODE_CONFIG, decode_rows=True,
        )  # fmt: skip
