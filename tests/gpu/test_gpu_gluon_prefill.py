"""GPU (Hopper): the Gluon FA3-style prefill kernel against a float32 torch oracle and the
Triton prefill kernel: one 16k prompt, packed prompts of odd lengths after rows owned by
others, cached prefixes over shuffled block tables, block sizes from 8 to 256, bf16 and fp16,
head_dim 128 and 64; cache blocks outside the tables poisoned with NaN (never read)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import skip_unless_supported
from tests.kernels.paged_case import make_paged_case, tolerance

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(scope="module")
def gluon_prefill():
    """The launcher, or a skip where the GPU or triton cannot run it (not Hopper, no Gluon)."""
    from minivllm.kernels import gluon_prefill_attention as module

    skip_unless_supported(module)
    return module.gluon_prefill_attention


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q ([n, H, D], the last n positions) over k, v ([L, Hkv, D]) in
    float32 on the GPU, 1024 queries at a time (a 16k x 16k score matrix would not fit)."""
    n, seq_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    kf = k.cuda().float().repeat_interleave(group, 1).transpose(0, 1)  # [H, L, D]
    vf = v.cuda().float().repeat_interleave(group, 1).transpose(0, 1)
    out = torch.empty(n, q.shape[1], q.shape[2], device="cuda")
    for r0 in range(0, n, 1024):
        qf = q[r0 : r0 + 1024].float().transpose(0, 1)  # [H, c, D]
        q_pos = torch.arange(seq_len - n + r0, seq_len - n + r0 + qf.shape[1], device="cuda")
        visible = torch.arange(seq_len, device="cuda")[None, :] <= q_pos[:, None]
        s = (qf @ kf.transpose(1, 2) * scale).masked_fill(~visible, float("-inf"))
        out[r0 : r0 + 1024] = (s.softmax(-1) @ vf).transpose(0, 1)
    return out


def _run(gluon_prefill, seq_lens, query_lens, num_heads=16, num_kv_heads=8, head_dim=128,
         block_size=16, dtype=torch.bfloat16, start_row=0, num_pad_rows=3, **tiles):  # fmt: skip
    """Both kernels on the same packed batch; each request's rows against the oracle, the
    Gluon output against the Triton one, rows outside the requests left untouched."""
    from minivllm.kernels.prefill_attention import prefill_attention

    case = make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    used = case.block_tables[case.block_tables > 0].long()
    unused = torch.ones(case.kv_cache.shape[1], dtype=torch.bool, device="cuda")
    unused[used] = False
    case.kv_cache[:, unused] = float("nan")  # block 0 and the spare: must never be read
    starts = [start_row]
    for n in query_lens:
        starts.append(starts[-1] + n)
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(starts[-1] + num_pad_rows, num_heads, head_dim, device="cuda", generator=gen)
    q = q.to(dtype)
    qsl = torch.tensor(starts, dtype=torch.int32, device="cuda")
    scale = head_dim**-0.5
    args = (q, case.kv_cache, qsl, case.seq_lens, case.block_tables, scale)
    out = gluon_prefill(*args, torch.full_like(q, float("nan")), start_row, **tiles)
    triton_out = prefill_attention(*args, torch.full_like(q, float("nan")), start_row)
    tol = tolerance(dtype)
    for i, (k, v) in enumerate(case.contexts):
        rows = slice(starts[i], starts[i + 1])
        expected = _reference(q[rows], k, v, scale)
        torch.testing.assert_close(out[rows].float(), expected, **tol, msg=f"seq {i} vs torch")
        torch.testing.assert_close(out[rows], triton_out[rows], **tol, msg=f"seq {i} vs triton")
    assert torch.isnan(out[:start_row]).all() and torch.isnan(out[starts[-1] :]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_16k_prompt(gluon_prefill, dtype):
    _run(gluon_prefill, [16384], [16384], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_odd_lengths_after_other_rows(gluon_prefill, dtype):
    # Tile and block edges: 1 row, one short of / at / one past 64, 128 and 256 rows.
    lens = [1, 15, 63, 64, 65, 127, 128, 129, 255, 257, 1000, 2049]
    _run(gluon_prefill, lens, lens, dtype=dtype, start_row=5)


@pytest.mark.parametrize("block_size", [8, 16, 64, 128, 256])
def test_cached_prefix_shuffled_blocks(gluon_prefill, block_size):
    # seq_len > query_len: the new rows attend to a prefix already in the cache (prefix-cache
    # hits, chunked continuations); make_paged_case hands out blocks in random order.
    seq_lens = [333, 1000, 4097, 130, 700]
    query_lens = [1, 200, 1500, 130, 77]
    _run(gluon_prefill, seq_lens, query_lens, block_size=block_size)


@pytest.mark.parametrize(
    "block_n,num_stages,pingpong", [(64, 2, True), (128, 3, True), (64, 4, True), (128, 2, False)]
)
def test_tuning_overrides(gluon_prefill, block_n, num_stages, pingpong):
    _run(gluon_prefill, [3000, 513], [2999, 100], block_n=block_n, num_stages=num_stages,
         pingpong=pingpong)  # fmt: skip


def test_heads_fastest_order(gluon_prefill):
    _run(gluon_prefill, [3000, 513, 40], [2999, 100, 40], kv_head_major=False)


def test_head_dim_64_gqa_4(gluon_prefill):
    _run(gluon_prefill, [2100, 300], [2000, 300], num_heads=16, num_kv_heads=4, head_dim=64)


def test_supports_and_refusals(gluon_prefill):
    from minivllm.kernels.gluon_prefill_attention import supports

    def pair(dtype=torch.bfloat16, head_dim=128, block_size=16, cache_dtype=None):
        q = torch.empty(4, 2, head_dim, dtype=dtype, device="cuda")
        cache = torch.empty(2, 3, block_size, 1, head_dim, dtype=cache_dtype or dtype,
                            device="cuda")  # fmt: skip
        return q, cache

    assert supports(*pair()) and supports(*pair(torch.float16)) and supports(*pair(head_dim=64))
    assert not supports(*pair(torch.float32))
    assert not supports(*pair(head_dim=80))
    assert not supports(*pair(block_size=4))
    assert not supports(*pair(cache_dtype=torch.float8_e4m3fn))
    q, cache = pair(cache_dtype=torch.float8_e4m3fn)
    meta = (torch.tensor([0, 4], dtype=torch.int32, device="cuda"),
            torch.tensor([4], dtype=torch.int32, device="cuda"),
            torch.zeros(1, 1, dtype=torch.int32, device="cuda"))  # fmt: skip
    with pytest.raises(NotImplementedError, match="fp8"):
        gluon_prefill(q, cache, *meta, 0.1, torch.empty_like(q))
    q, cache = pair(block_size=4)
    with pytest.raises(ValueError, match="block_size"):
        gluon_prefill(q, cache, *meta, 0.1, torch.empty_like(q))
    q, cache = pair()
    with pytest.raises(ValueError, match="shared memory"):  # 4 stages of 128 x 128 K and V
        gluon_prefill(q, cache, *meta, 0.1, torch.empty_like(q), num_stages=4)
