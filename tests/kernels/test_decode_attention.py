"""decode_attention vs a torch oracle: ragged contexts, GQA, block edges, split-KV on and off."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE, make_paged_case, ref_attention, tolerance

from minivllm.kernels.decode_attention import choose_num_splits, decode_attention

BLOCK = 16
# Ragged contexts around block (16) and tile (64) edges; 0 is a padded CUDA-graph row.
SEQ_LENS = [1, BLOCK - 1, BLOCK, BLOCK + 1, 70, 0, 3]


def _run(seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits, order=None):
    case = make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    num_seqs = len(seq_lens)
    q = torch.randn(num_seqs, num_heads, head_dim, generator=torch.Generator().manual_seed(1))
    q = q.to(dtype).to(DEVICE)
    out = torch.full_like(q, float("nan"))
    mid_o = torch.full(
        (num_seqs + 1, num_heads, num_splits + 1, head_dim), float("nan"), device=DEVICE
    )
    mid_lse = torch.full(mid_o.shape[:3], float("nan"), device=DEVICE)
    scale = head_dim**-0.5
    if order is not None:
        order = torch.tensor(order, dtype=torch.int32, device=DEVICE)
    decode_attention(
        q, case.kv_cache, case.block_tables, case.seq_lens, scale, out, num_splits, mid_o, mid_lse,
        order=order,
    )  # fmt: skip
    for i, (k, v) in enumerate(case.contexts):
        if seq_lens[i] == 0:
            torch.testing.assert_close(out[i].cpu().float(), torch.zeros(num_heads, head_dim))
            continue
        expected = ref_attention(q[i : i + 1], k, v, scale)[0]
        torch.testing.assert_close(
            out[i].cpu().float(), expected, **tolerance(dtype), msg=f"seq {i}"
        )
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_gqa_and_splits(dtype, num_heads, num_kv_heads, num_splits):
    _run(SEQ_LENS, num_heads, num_kv_heads, 64, BLOCK, dtype, num_splits)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_head_dim_128_small_blocks(num_splits):
    _run([5, 33, 0, 4], 4, 1, 128, 4, torch.float16, num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_longest_first_order(num_splits):
    # The launch order changes which program runs when, not what any program computes.
    longest_first = sorted(range(len(SEQ_LENS)), key=lambda i: -SEQ_LENS[i])
    plain = _run(SEQ_LENS, 4, 2, 64, BLOCK, torch.float32, num_splits)
    ordered = _run(SEQ_LENS, 4, 2, 64, BLOCK, torch.float32, num_splits, longest_first)
    assert torch.equal(plain, ordered)


def test_decode_takes_its_rows_from_order():
    case = make_paged_case([17, 9, 30], 2, 64, BLOCK, torch.float32)
    q = torch.randn(3, 4, 64, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    order = torch.tensor([2, 2, 2], dtype=torch.int32, device=DEVICE)
    decode_attention(q, case.kv_cache, case.block_tables, case.seq_lens, 0.125, out, order=order)
    k, v = case.contexts[2]
    expected = ref_attention(q[2:3], k, v, 0.125)[0]
    torch.testing.assert_close(out[2].cpu(), expected, **tolerance(torch.float32))
    assert torch.isnan(out[:2]).all()  # rows 0 and 1 were never launched


def test_decode_rejects_more_requests_than_the_grid_holds(monkeypatch):
    import minivllm.kernels.decode_attention as module

    monkeypatch.setattr(module, "_MAX_GRID_Y", 2)  # CUDA's 65,535, scaled down
    case = make_paged_case([5, 6, 7], 2, 64, BLOCK, torch.float32)
    q = torch.randn(3, 4, 64, device=DEVICE)
    with pytest.raises(ValueError, match="at most 2 requests"):
        decode_attention(q, case.kv_cache, case.block_tables, case.seq_lens, 1.0, q.clone())


def test_decode_more_splits_than_tiles():
    # 16 partitions over 20 tokens: most partitions are empty and must weigh 0.
    _run([20, 1], 2, 1, 64, 8, torch.float32, 16)


def test_decode_writes_into_strided_out():
    case = make_paged_case([17, 9], 2, 64, BLOCK, torch.float32)
    q = torch.randn(2, 4, 64, device=DEVICE)
    wide = torch.zeros(2, 8, 64, device=DEVICE)
    out = wide[:, :4]  # a view with row stride 8 * 64
    decode_attention(q, case.kv_cache, case.block_tables, case.seq_lens, 0.125, out)
    for i, (k, v) in enumerate(case.contexts):
        torch.testing.assert_close(
            out[i].cpu(), ref_attention(q[i : i + 1], k, v, 0.125)[0], **tolerance(torch.float32)
        )
    assert torch.all(wide[:, 4:] == 0)


def test_choose_num_splits():
    assert choose_num_splits(256, 8, 1000, 132) == 1
    assert choose_num_splits(4, 8, 8000, 132) == 9
    assert choose_num_splits(1, 8, 8000, 132, max_splits=16) == 16
    assert choose_num_splits(1, 8, 100, 132) == 1


def test_decode_rejects_bad_input():
    case = make_paged_case([5], 2, 64, BLOCK, torch.float32)
    q = torch.randn(1, 4, 64, device=DEVICE)
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="mid_o"):
        decode_attention(q, case.kv_cache, case.block_tables, case.seq_lens, 1.0, out, num_splits=2)
    with pytest.raises(ValueError, match="seq_lens"):
        decode_attention(q, case.kv_cache, case.block_tables, case.seq_lens.long(), 1.0, out)
    with pytest.raises(ValueError, match="multiple"):
        decode_attention(q[:, :3], case.kv_cache, case.block_tables, case.seq_lens, 1.0, out[:, :3])
    with pytest.raises(ValueError, match="dtype"):
        decode_attention(q.half(), case.kv_cache, case.block_tables, case.seq_lens, 1.0, out.half())
    args = (q, case.kv_cache, case.block_tables, case.seq_lens, 1.0, out)
    with pytest.raises(ValueError, match="order"):
        decode_attention(*args, order=torch.zeros(1, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="order length"):
        decode_attention(*args, order=torch.zeros(2, dtype=torch.int32, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_splits", [1, 8])
def test_decode_bf16_real_size(num_splits):
    seq_lens = [1000, 1, 16, 17, 513, 2047, 64, 300]
    _run(seq_lens, 16, 8, 128, 16, torch.bfloat16, num_splits)
    longest_first = sorted(range(len(seq_lens)), key=lambda i: -seq_lens[i])
    _run(seq_lens, 16, 8, 128, 16, torch.bfloat16, num_splits, longest_first)
