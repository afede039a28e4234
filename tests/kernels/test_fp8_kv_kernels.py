"""FP8 (e4m3) KV cache kernels: the store kernel's bytes against torch's cast, and decode /
prefill attention over an fp8 cache against a torch oracle that dequantizes it."""

from __future__ import annotations

import pytest
import torch
from ordered_dot import ordered_dot  # noqa: F401 (fixture)
from paged_case import DEVICE, PagedCase, make_paged_case, ref_attention, tolerance

from minivllm.kernels.attention_segments import SegmentRule
from minivllm.kernels.batch_invariant_attention import batch_invariant_attention
from minivllm.kernels.decode_attention import decode_attention
from minivllm.kernels.kv_store import store_kv
from minivllm.kernels.prefill_attention import prefill_attention

FP8 = torch.float8_e4m3fn


def ref_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What an fp8 cache must hold: x / scale, saturated, rounded to nearest even."""
    return (x.float() / scale).clamp(-448.0, 448.0).to(FP8)


def quantize_case(case: PagedCase, k_scale: float, v_scale: float) -> PagedCase:
    """The case with an fp8 cache and, as contexts, the values that cache dequantizes to."""
    cache = torch.stack([ref_quantize(case.kv_cache[0], k_scale),
                         ref_quantize(case.kv_cache[1], v_scale)])  # fmt: skip
    contexts = [
        (ref_quantize(k, k_scale).float() * k_scale, ref_quantize(v, v_scale).float() * v_scale)
        for k, v in case.contexts
    ]
    return PagedCase(cache.contiguous(), case.block_tables, case.seq_lens, contexts)


def _every_fp16_value() -> torch.Tensor:
    """All finite float16 values (subnormals, ties, values past 448), then +-inf."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.float16)
    values = values[torch.isfinite(values)]
    return torch.cat([values, torch.tensor([float("inf"), float("-inf")], dtype=torch.float16)])


@pytest.mark.parametrize(
    "dtype,k_scale,v_scale", [(torch.float16, 1.0, 1.0), (torch.float32, 0.37, 4.0)]
)
def test_store_kv_fp8_bytes_match_torch(dtype, k_scale, v_scale):
    values = _every_fp16_value().to(dtype)
    # 1,024 values a token (zeros pad the last): 63 programs in the interpreter, not 992.
    num_kv_heads, head_dim = 8, 128
    values = torch.cat([values, values.new_zeros(-values.numel() % 1024)])
    values = values.view(-1, num_kv_heads, head_dim)
    k, v = values, values.flip(0)
    num_tokens = k.shape[0]
    slots = torch.randperm(num_tokens + 8, generator=torch.Generator().manual_seed(0))
    slots = slots[:num_tokens].clone()
    slots[::7] = -1  # padded rows: nothing written
    shape = (2, -(-(num_tokens + 8) // 4), 4, num_kv_heads, head_dim)
    cache = torch.zeros(shape, dtype=FP8, device=DEVICE)
    store_kv(k.to(DEVICE), v.to(DEVICE), cache, slots.to(DEVICE), k_scale, v_scale)
    flat = cache.cpu().view(torch.uint8).view(2, -1, num_kv_heads, head_dim)
    keep = slots >= 0
    for i, (x, scale) in enumerate(((k, k_scale), (v, v_scale))):
        expected = ref_quantize(x[keep], scale).view(torch.uint8)
        assert torch.equal(flat[i, slots[keep]], expected)
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots[keep]] = False
    assert not flat[:, untouched].any()


def test_store_kv_fp8_rejects_bad_scales_and_dtypes():
    k = torch.randn(3, 2, 32, device=DEVICE)
    slots = torch.arange(3, device=DEVICE)
    fp8_cache = torch.zeros(2, 2, 4, 2, 32, dtype=FP8, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale must be finite and > 0"):
        store_kv(k, k, fp8_cache, slots, 0.0, 1.0)
    with pytest.raises(ValueError, match="k.dtype"):
        store_kv(k, k.half(), fp8_cache, slots)
    with pytest.raises(ValueError, match="fp8 cache only"):
        store_kv(k, k, torch.zeros(2, 2, 4, 2, 32, device=DEVICE), slots, 1.0, 2.0)


def _decode(case, q, num_splits, k_scale, v_scale):
    num_seqs, num_heads, head_dim = q.shape
    out = torch.full_like(q, float("nan"))
    mid_o = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=DEVICE)
    mid_lse = torch.empty(mid_o.shape[:3], device=DEVICE)
    decode_attention(q, case.kv_cache, case.block_tables, case.seq_lens, head_dim**-0.5, out,
                     num_splits, mid_o, mid_lse, k_scale=k_scale, v_scale=v_scale)  # fmt: skip
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,num_splits", [(4, 2, 1), (8, 2, 3)])
def test_decode_attention_fp8_cache(dtype, num_heads, num_kv_heads, num_splits):
    seq_lens, head_dim, k_scale, v_scale = [1, 15, 17, 70, 0], 64, 0.5, 2.0
    case = make_paged_case(seq_lens, num_kv_heads, head_dim, 16, torch.float32)
    fp8 = quantize_case(case, k_scale, v_scale)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    out = _decode(fp8, q, num_splits, k_scale, v_scale)
    for i, (k, v) in enumerate(fp8.contexts):
        if seq_lens[i] == 0:
            assert not out[i].any()
            continue
        expected = ref_attention(q[i : i + 1], k, v, head_dim**-0.5)[0]
        torch.testing.assert_close(out[i].cpu().float(), expected, **tolerance(dtype))
        # Against the unquantized cache: only fp8's rounding (2**-4 relative) apart.
        exact = ref_attention(q[i : i + 1], *case.contexts[i], head_dim**-0.5)[0]
        torch.testing.assert_close(out[i].cpu().float(), exact, atol=0.1, rtol=0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_attention_fp8_cache(dtype):
    # Whole prompts and prefix hits / chunked continuations, across block and tile edges.
    seq_lens, query_lens = [1, 17, 33, 40], [1, 17, 5, 16]
    num_heads, num_kv_heads, head_dim, k_scale, v_scale = 4, 2, 64, 2.0, 0.25
    case = quantize_case(
        make_paged_case(seq_lens, num_kv_heads, head_dim, 16, torch.float32), k_scale, v_scale
    )
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    out = torch.full_like(q, float("nan"))
    qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    prefill_attention(q, case.kv_cache, qsl, case.seq_lens, case.block_tables, head_dim**-0.5,
                      out, block_m=16, block_n=16, k_scale=k_scale, v_scale=v_scale)  # fmt: skip
    for i, (k, v) in enumerate(case.contexts):
        rows = slice(starts[i], starts[i + 1])
        expected = ref_attention(q[rows], k, v, head_dim**-0.5)
        torch.testing.assert_close(out[rows].cpu().float(), expected, **tolerance(dtype))


def test_attention_rejects_scales_without_fp8_cache():
    case = make_paged_case([5], 1, 64, 16, torch.float32)
    q = torch.randn(1, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="fp8 cache only"):
        _decode(case, q, 1, 2.0, 1.0)


@pytest.mark.usefixtures("ordered_dot")
def test_batch_invariant_attention_fp8_cache():
    """Deterministic mode over an fp8 cache: the oracle's values, and a decode row's bits the
    same from the split launch, the one-pass decode launch and a prefill chunk."""
    seq_lens, num_heads, head_dim, k_scale, v_scale = [40, 75], 4, 32, 0.5, 2.0
    case = quantize_case(make_paged_case(seq_lens, 2, head_dim, 8, torch.float32), k_scale, v_scale)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(sum(seq_lens), num_heads, head_dim, generator=gen).to(DEVICE)
    qsl = torch.tensor([0, seq_lens[0], sum(seq_lens)], dtype=torch.int32, device=DEVICE)
    scales = {"k_scale": k_scale, "v_scale": v_scale, "segments": SegmentRule(16, 2, 64)}
    common = (case.seq_lens, case.block_tables, head_dim**-0.5)
    prefill = batch_invariant_attention(q, case.kv_cache, qsl, *common, torch.empty_like(q),
                                        config=(32, 16, 4, 1), **scales)  # fmt: skip
    for i, (k, v) in enumerate(case.contexts):
        rows = slice(qsl[i].item(), qsl[i + 1].item())
        expected = ref_attention(q[rows], k, v, head_dim**-0.5)
        torch.testing.assert_close(prefill[rows].cpu(), expected, **tolerance(torch.float32))
    last = qsl[1:] - 1  # each request's last token, as a decode row
    dq, one = q[last].contiguous(), torch.arange(3, dtype=torch.int32, device=DEVICE)
    dims = {"part_acc": (head_dim,), "part_m": (), "part_l": ()}
    parts = {name: torch.empty(2, num_heads, 4, *d, device=DEVICE) for name, d in dims.items()}
    for extra in ({}, {"num_segments": 4, **parts}):
        decode = batch_invariant_attention(dq, case.kv_cache, one, *common, torch.empty_like(dq),
                                           config=(16, 16, 2, 1), decode_rows=True,
                                           **scales, **extra)  # fmt: skip
        assert torch.equal(decode, prefill[last])
