"""prefill_attention vs a torch oracle: packed ragged requests, prefix hits, chunked
continuations, GQA folding, block and tile edges, rows owned by others left untouched."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE, make_paged_case, ref_attention, tolerance

from minivllm.kernels.prefill_attention import MIN_PROGRAMS, prefill_attention, prefill_config


def _run(seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype,
         start_row=0, block_m=16, block_n=16, num_pad_rows=2):  # fmt: skip
    case = make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    starts = [start_row]
    for n in query_lens:
        starts.append(starts[-1] + n)
    num_rows = starts[-1] + num_pad_rows
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(num_rows, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    out = torch.full_like(q, float("nan"))
    qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    prefill_attention(q, case.kv_cache, qsl, case.seq_lens, case.block_tables, scale, out,
                      start_row=start_row, block_m=block_m, block_n=block_n)  # fmt: skip
    for i, (k, v) in enumerate(case.contexts):
        rows = slice(starts[i], starts[i + 1])
        expected = ref_attention(q[rows], k, v, scale)
        torch.testing.assert_close(
            out[rows].cpu().float(), expected, **tolerance(dtype), msg=f"seq {i}"
        )
    # Rows of other owners (before start_row) and padding rows are never written.
    assert torch.isnan(out[:start_row]).all() and torch.isnan(out[starts[-1] :]).all()


FULL = ([1, 15, 16, 17, 40], [1, 15, 16, 17, 40])  # whole prompts
PREFIX = (
    [33, 16, 17, 40, 30, 26],
    [5, 1, 16, 16, 16, 20],
)  # prefix-cache hits / chunked continuations


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("lens", [FULL, PREFIX], ids=["full", "prefix"])
def test_prefill_gqa_ragged(dtype, num_heads, num_kv_heads, lens):
    _run(*lens, num_heads, num_kv_heads, 64, 16, dtype)


@pytest.mark.parametrize("block_m,block_n", [(32, 16), (16, 32), (128, 64)])
def test_prefill_head_dim_128_tiles(block_m, block_n):
    _run([7, 37, 20], [7, 30, 1], 4, 1, 128, 4, torch.float16, block_m=block_m, block_n=block_n)


def test_prefill_after_decode_rows():
    # Three decode rows come first; the kernel handles the requests from row 3 on.
    _run([9, 25], [9, 4], 4, 2, 64, 8, torch.float32, start_row=3)


def test_prefill_odd_group_and_head_dim():
    # group 3 leaves unused rows in a 16-row tile; head_dim 80 pads to 128.
    _run([18, 5], [18, 2], 6, 2, 80, 16, torch.float32)


@pytest.mark.parametrize("head_dim", [64, 80])
def test_prefill_default_config(head_dim):
    # No overrides: the small-batch config from the table, masked (80) and unmasked (64) dims.
    _run([70, 40, 5], [70, 24, 5], 4, 2, head_dim, 16, torch.float16, block_m=None, block_n=None)


def test_prefill_config_switches_to_small_tiles_for_small_batches():
    large = prefill_config(128, 4096, 2, 8)  # 64 tiles of 64 tokens x 8 kv heads
    small = prefill_config(128, 1000, 2, 8)  # 16 tiles x 8 kv heads: less than one wave
    assert (4096 * 2 // large[0]) * 8 >= MIN_PROGRAMS > (1000 * 2 // large[0]) * 8
    assert small[0] < large[0]
    with pytest.raises(ValueError, match="head_dim"):
        prefill_config(512, 16, 1, 1)


def test_prefill_rejects_bad_input():
    case = make_paged_case([5], 2, 64, 16, torch.float32)
    q = torch.randn(5, 4, 64, device=DEVICE)
    qsl = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    args = (case.kv_cache, qsl, case.seq_lens, case.block_tables, 1.0, torch.empty_like(q))
    with pytest.raises(ValueError, match="query_start_loc length"):
        prefill_attention(q, case.kv_cache, qsl[:1], *args[2:])
    with pytest.raises(ValueError, match="block_n"):
        prefill_attention(q, *args, block_n=24)
    with pytest.raises(ValueError, match="out.shape"):
        prefill_attention(q, *args[:-1], torch.empty_like(q[:4]))
    with pytest.raises(ValueError, match="scale"):
        prefill_attention(q, *args[:4], 0.0, args[5])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_heads,num_kv_heads", [(16, 8), (32, 8)])
def test_prefill_bf16_real_size(num_heads, num_kv_heads):
    seq_lens, query_lens = [1000, 300, 2048, 17], [1000, 129, 512, 17]
    _run(
        seq_lens,
        query_lens,
        num_heads,
        num_kv_heads,
        128,
        16,
        torch.bfloat16,
        block_m=None,
        block_n=None,
    )
