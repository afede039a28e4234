"""decode_attention vs a torch oracle: ragged contexts, GQA, block edges, split-KV on and off
(even splits and fixed-length partitions), and the split plan (kernels/decode_partition.py)."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE, make_paged_case, ref_attention, tolerance

from minivllm.kernels.decode_attention import choose_num_splits, decode_attention
from minivllm.kernels.decode_partition import DecodePlan, DecodePolicy, choose_decode_plan

BLOCK = 16
# Ragged contexts around block (16) and tile (64) edges; 0 is a padded CUDA-graph row.
SEQ_LENS = [1, BLOCK - 1, BLOCK, BLOCK + 1, 70, 0, 3]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _run(seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits,
         case=None, **kwargs):  # fmt: skip
    case = case or make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    num_seqs = len(seq_lens)
    q = torch.randn(num_seqs, num_heads, head_dim, generator=torch.Generator().manual_seed(1))
    q = q.to(dtype).to(DEVICE)
    out = torch.full_like(q, float("nan"))
    mid_o = torch.full(
        (num_seqs + 1, num_heads, num_splits + 1, head_dim), float("nan"), device=DEVICE
    )
    mid_lse = torch.full(mid_o.shape[:3], float("nan"), device=DEVICE)
    scale = head_dim**-0.5
    decode_attention(
        q, case.kv_cache, case.block_tables, case.seq_lens, scale, out, num_splits, mid_o, mid_lse,
        **kwargs,
    )  # fmt: skip
    for i, (k, v) in enumerate(case.contexts):
        if seq_lens[i] == 0:
            torch.testing.assert_close(out[i].cpu().float(), torch.zeros(num_heads, head_dim))
            continue
        expected = ref_attention(q[i : i + 1], k, v, scale)[0]
        torch.testing.assert_close(
            out[i].cpu().float(), expected, **tolerance(dtype), msg=f"seq {i}"
        )
    return mid_lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_gqa_and_splits(dtype, num_heads, num_kv_heads, num_splits):
    _run(SEQ_LENS, num_heads, num_kv_heads, 64, BLOCK, dtype, num_splits)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_head_dim_128_small_blocks(num_splits):
    _run([5, 33, 0, 4], 4, 1, 128, 4, torch.float16, num_splits)


def test_decode_more_splits_than_tiles():
    # 16 partitions over 20 tokens: most partitions are empty and must weigh 0.
    _run([20, 1], 2, 1, 64, 8, torch.float32, 16)


# Fixed-length partitions at mixed contexts: 0, one token, block (16) and partition (32) edges,
# lengths that are no multiple of either, and contexts of 1 to 7 partitions.
MIXED_LENS = [0, 1, 15, 16, 17, 31, 32, 33, 70, 200, 5, 129]
TILE16 = (16, 4, 1)  # config (block_n, num_warps, num_stages): several tiles per partition


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "num_splits",
    [7, 16, 3],  # cdiv(200, 32); a grid sized for longer contexts (a captured graph); too few
)
def test_decode_fixed_partitions(dtype, num_splits):
    # num_splits 3 < cdiv(200, 32): long contexts get partitions longer than partition_len.
    mid_lse = _run(MIXED_LENS, 4, 2, 64, BLOCK, dtype, num_splits, partition_len=32,
                   config=TILE16)  # fmt: skip
    # The plan was followed: only requests of several partitions used the scratch, one lse
    # per partition of max(32, cdiv(seq_len, num_splits) rounded up to 16) tokens.
    for i, n in enumerate(MIXED_LENS):
        split_len = max(32, _cdiv(_cdiv(n, num_splits), 16) * 16)
        live = _cdiv(n, split_len)
        written = (~mid_lse[i].isnan()).sum(-1).cpu()
        assert written.tolist() == [live if live > 1 else 0] * 4, f"seq {i}"


def test_decode_fixed_partitions_round_up_to_whole_tiles():
    # partition_len 20 becomes 32 with 16-token tiles; the default config (64-token tiles): 64.
    _run(MIXED_LENS, 2, 1, 64, 8, torch.float32, 8, partition_len=20, config=TILE16)
    _run(MIXED_LENS, 2, 1, 64, 8, torch.float32, 4, partition_len=20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_fixed_partitions_fp8_cache(dtype):
    k_scale, v_scale, fp8 = 0.5, 2.0, torch.float8_e4m3fn
    case = make_paged_case(MIXED_LENS, 2, 64, BLOCK, torch.float32)
    quant = [(case.kv_cache[i].float() / s).clamp(-448, 448).to(fp8) for i, s in
             ((0, k_scale), (1, v_scale))]  # fmt: skip
    case.kv_cache = torch.stack(quant).contiguous()
    case.contexts = [
        ((k / k_scale).clamp(-448, 448).to(fp8).float() * k_scale,
         (v / v_scale).clamp(-448, 448).to(fp8).float() * v_scale)
        for k, v in case.contexts
    ]  # fmt: skip
    _run(MIXED_LENS, 4, 2, 64, BLOCK, dtype, 16, case=case, partition_len=32,
         config=TILE16, k_scale=k_scale, v_scale=v_scale)  # fmt: skip


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


def test_choose_decode_plan():
    # b256 x 8 kv heads fills 132 SMs: fixed partitions, count from the launch's max_seq_len.
    assert choose_decode_plan(256, 8, 2000, 132) == DecodePlan(4, 512)
    assert choose_decode_plan(256, 8, 4096, 132, kv_elem_size=1) == DecodePlan(4, 1024)
    # A captured graph's max_model_len past max_splits partitions: capped (partitions grow).
    assert choose_decode_plan(256, 8, 40960, 132) == DecodePlan(16, 512)
    assert choose_decode_plan(256, 8, 500, 132) == DecodePlan(1)  # one partition: no split
    # Small batches keep the even (occupancy) split.
    assert choose_decode_plan(4, 8, 8000, 132) == DecodePlan(9)
    assert choose_decode_plan(1, 8, 100, 132) == DecodePlan(1)
    off = DecodePolicy(balance_min_waves=float("inf"))
    assert choose_decode_plan(256, 8, 2000, 132, policy=off) == DecodePlan(1)
    assert choose_decode_plan(256, 8, 2000, 132, policy=DecodePolicy(partition_len=())) == (
        DecodePlan(1)
    )
    with pytest.raises(ValueError, match="max_splits"):
        DecodePolicy(max_splits=0)


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
    with pytest.raises(ValueError, match="partition_len"):
        decode_attention(q, case.kv_cache, case.block_tables, case.seq_lens, 1.0, out,
                         partition_len=-1)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_splits,partition_len", [(1, 0), (8, 0), (8, 512), (16, 256)])
def test_decode_bf16_real_size(num_splits, partition_len):
    # (16, 256): a grid sized for 4,096 tokens (a captured graph), fixed 256-token partitions.
    seq_lens = [1000, 1, 16, 17, 513, 2047, 64, 300]
    _run(seq_lens, 16, 8, 128, 16, torch.bfloat16, num_splits, partition_len=partition_len)
