"""batch_invariant_attention: close to a torch oracle, and bit-identical for a token whatever
path computes it (one prefill chunk, other chunkings, a decode in any batch, split or not),
with decode launches on smaller tiles than prefill launches (only BLOCK_N is shared)."""

from __future__ import annotations

import pytest
import torch
from ordered_dot import ordered_dot  # noqa: F401 (fixture)
from paged_case import DEVICE, make_paged_case, ref_attention, tolerance

from minivllm.kernels.batch_invariant_attention import batch_invariant_attention

CONFIG = (32, 16, 4, 1)  # prefill tiles: block_m 32 (16 tokens x group 2), block_n 16
DECODE_CONFIG = (16, 16, 2, 1)  # decode tiles: the group padded to 16 rows, fewer warps
SEG_N = 32
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
        HEAD_DIM**-0.5, out, start_row=start_row, seg_n=SEG_N, config=CONFIG,
    )  # fmt: skip


def _decode(q, case, seq_lens, block_tables, split: bool):
    """One decode row per entry of seq_lens (rows of q in order)."""
    n = len(seq_lens)
    out = torch.full_like(q, float("nan"))
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    num_segments = -(-max(seq_lens) // SEG_N) + 1 if split else 0  # one spare: must exit
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
        num_segments=num_segments, seg_n=SEG_N, config=DECODE_CONFIG, decode_rows=True, **parts,
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
    """Request 0 (70 tokens, over 2 segments) next to a neighbour: every token's row is the
    same bits from one prefill, from chunked prefills, and from decodes (split or not)."""
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


def test_split_and_decode_launches_reject_prefill_rows():
    case = make_paged_case([10], NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, torch.float32)
    q = torch.zeros(4, NUM_HEADS, HEAD_DIM, device=DEVICE)
    scratch = torch.empty(4, NUM_HEADS, 1, device=DEVICE)
    with pytest.raises(ValueError, match="decode rows only"):
        batch_invariant_attention(
            q, case.kv_cache, _qsl([4]), case.seq_lens, case.block_tables, 0.1, q.clone(),
            num_segments=1, part_acc=scratch[..., None].expand(-1, -1, -1, HEAD_DIM),
            part_m=scratch, part_l=scratch, seg_n=SEG_N, config=CONFIG,
        )  # fmt: skip
    with pytest.raises(ValueError, match="decode rows only"):
        batch_invariant_attention(
            q, case.kv_cache, _qsl([4]), case.seq_lens, case.block_tables, 0.1, q.clone(),
            seg_n=SEG_N, config=DECODE_CONFIG, decode_rows=True,
        )  # fmt: skip
