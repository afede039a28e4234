"""GPU (Hopper): deterministic mode's Gluon prefill kernel gives every row the bits of the
batch-invariant Triton kernel (kernels/batch_invariant_attention.py): its varlen walk on the
same rows, the same prompt in other chunks, and the rows as decodes (one pass and split by
segment); packed prompts after others' rows, cached prefixes over shuffled blocks of 8-256
tokens, fp16, head_dim 64; close to a float32 oracle."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import skip_unless_supported
from tests.kernels.paged_case import make_paged_case, ref_attention, tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(scope="module")
def gluon_bi():
    from minivllm.kernels import gluon_batch_invariant_attention as module

    skip_unless_supported(module)
    return module.gluon_batch_invariant_attention


def _packed(case, query_lens, num_heads, head_dim, dtype, start_row):
    starts = [start_row]
    for n in query_lens:
        starts.append(starts[-1] + n)
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(starts[-1] + 3, num_heads, head_dim, device="cuda", generator=gen).to(dtype)
    qsl = torch.tensor(starts, dtype=torch.int32, device="cuda")
    return q, qsl, starts


def _decode_rows(case, q, starts, seq_idx, positions, scale):
    """The rows of request seq_idx at these positions, recomputed as decode rows (one query
    each over its own context), one pass and split by segment."""
    from minivllm.kernels.attention_segments import SEGMENTS
    from minivllm.kernels.batch_invariant_attention import batch_invariant_attention

    seq_len = int(case.seq_lens[seq_idx])
    query_len = starts[seq_idx + 1] - starts[seq_idx]
    n = len(positions)
    rows = q[[starts[seq_idx] + p - (seq_len - query_len) for p in positions]].contiguous()
    qsl = torch.arange(n + 1, dtype=torch.int32, device="cuda")
    lens = torch.tensor([p + 1 for p in positions], dtype=torch.int32, device="cuda")
    tables = case.block_tables[seq_idx : seq_idx + 1].expand(n, -1).contiguous()
    args = (rows, case.kv_cache, qsl, lens, tables, scale)
    plain = batch_invariant_attention(*args, torch.empty_like(rows), decode_rows=True)
    segs = SEGMENTS.max_count(max(positions) + 1)
    parts = {
        "part_acc": torch.empty(n, q.shape[1], segs, q.shape[2], device="cuda"),
        "part_m": torch.empty(n, q.shape[1], segs, device="cuda"),
        "part_l": torch.empty(n, q.shape[1], segs, device="cuda"),
    }
    split = batch_invariant_attention(*args, torch.empty_like(rows), num_segments=segs, **parts)
    return plain, split


def _run(gluon_bi, seq_lens, query_lens, num_heads=16, num_kv_heads=8, head_dim=128,
         block_size=16, dtype=torch.bfloat16, start_row=0, decode_checks=(),
         oracle=True):  # fmt: skip
    from minivllm.kernels.batch_invariant_attention import batch_invariant_attention

    case = make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    q, qsl, starts = _packed(case, query_lens, num_heads, head_dim, dtype, start_row)
    scale = head_dim**-0.5
    args = (q, case.kv_cache, qsl, case.seq_lens, case.block_tables, scale)
    out = gluon_bi(*args, torch.full_like(q, float("nan")), start_row)
    walk = batch_invariant_attention(*args, torch.full_like(q, float("nan")), start_row)
    rows = slice(starts[0], starts[-1])
    assert torch.equal(out[rows], walk[rows]), (out[rows] != walk[rows]).nonzero()[:8]
    assert torch.isnan(out[:start_row]).all() and torch.isnan(out[starts[-1] :]).all()
    for i, (k, v) in enumerate(case.contexts):
        if oracle and seq_lens[i] <= 4096:
            got = out[starts[i] : starts[i + 1]].float().cpu()
            expected = ref_attention(q[starts[i] : starts[i + 1]], k, v, scale)
            torch.testing.assert_close(got, expected, **tolerance(dtype), msg=f"seq {i}")
    for seq_idx, positions in decode_checks:
        ctx0 = seq_lens[seq_idx] - query_lens[seq_idx]
        assert min(positions) >= ctx0, "a decode check takes this request's query rows"
        plain, split = _decode_rows(case, q, starts, seq_idx, positions, scale)
        mine = out[[starts[seq_idx] + p - ctx0 for p in positions]]
        assert torch.equal(plain, mine) and torch.equal(split, mine), f"decode rows of {seq_idx}"
    return case, q, out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_16k_prompt_equals_the_walk_and_decode_rows(gluon_bi, dtype):
    # Segment lengths change at contexts 1,024, 2,048, 4,096 and 8,192: rows on both sides.
    positions = [0, 127, 128, 1023, 1024, 1025, 2047, 2048, 4095, 4096, 8191, 8192, 16383]
    _run(gluon_bi, [16384], [16384], dtype=dtype, decode_checks=[(0, positions)], oracle=False)


def test_packed_odd_lengths_after_other_rows(gluon_bi):
    lens = [1, 15, 63, 64, 65, 127, 128, 129, 255, 257, 1000, 1025, 2049]
    _run(gluon_bi, lens, lens, start_row=5, decode_checks=[(12, [0, 1024, 2048]), (0, [0])])


@pytest.mark.parametrize("block_size", [8, 16, 64, 256])
def test_cached_prefix_shuffled_blocks(gluon_bi, block_size):
    seq_lens = [333, 1000, 4097, 130, 9000]
    query_lens = [1, 200, 1500, 130, 3000]
    _run(gluon_bi, seq_lens, query_lens, block_size=block_size,
         decode_checks=[(2, [2597, 4096]), (4, [6000, 8191, 8192, 8999])])  # fmt: skip


def test_chunks_of_one_prompt_equal_the_whole(gluon_bi):
    case, q, whole = _run(gluon_bi, [5000], [5000], oracle=False)
    scale = 128**-0.5
    for a, b in ((0, 700), (700, 1100), (1100, 4097), (4097, 5000)):
        qsl = torch.tensor([0, b - a], dtype=torch.int32, device="cuda")
        lens = torch.tensor([b], dtype=torch.int32, device="cuda")
        part = q[a:b].contiguous()
        out = gluon_bi(part, case.kv_cache, qsl, lens, case.block_tables, scale,
                       torch.empty_like(part))  # fmt: skip
        assert torch.equal(out, whole[a:b]), f"chunk {a}:{b}"


def test_head_dim_64_gqa_4(gluon_bi):
    _run(gluon_bi, [2100, 300], [2000, 300], num_heads=16, num_kv_heads=4, head_dim=64,
         decode_checks=[(0, [100, 1024, 2099])])  # fmt: skip


def test_refuses_fp8_and_other_shapes(gluon_bi):
    from minivllm.kernels.gluon_batch_invariant_attention import supports

    q = torch.empty(4, 2, 128, dtype=torch.bfloat16, device="cuda")
    assert supports(q, torch.empty(2, 3, 16, 1, 128, dtype=torch.bfloat16, device="cuda"))
    fp8 = torch.empty(2, 3, 16, 1, 128, dtype=torch.float8_e4m3fn, device="cuda")
    assert not supports(q, fp8)
    assert not supports(q[..., :80], torch.empty(2, 3, 16, 1, 80, device="cuda"))
