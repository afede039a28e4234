"""RoPE that writes K/V into the paged cache itself (rotary_embedding(..., kv_write=...)): the
same q, k and cache bytes as RoPE followed by store_kv, the oracle the engine used before."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.kv_store import KVWrite, store_kv
from minivllm.kernels.rope import rotary_embedding

FP8 = torch.float8_e4m3fn


def make_step(dtype, head_dim, seed):
    """q, k, v as views of one qkv buffer (as after the fused projection), positions, slots
    with padded rows (-1), a cos/sin cache, Qwen3 q/k norm weights."""
    g = torch.Generator().manual_seed(seed)
    num_tokens, num_heads, num_kv_heads = 7, 4, 2
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g) * 3
    qkv = qkv.to(dtype).to(DEVICE)
    q_end, k_end = num_heads * head_dim, (num_heads + num_kv_heads) * head_dim
    q = qkv[:, :q_end].view(num_tokens, num_heads, head_dim)
    k = qkv[:, q_end:k_end].view(num_tokens, num_kv_heads, head_dim)
    v = qkv[:, k_end:].view(num_tokens, num_kv_heads, head_dim)
    positions = torch.tensor([0, 5, 17, 63, 5, 40, 2], device=DEVICE)
    slots = torch.tensor([9, 0, -1, 31, 4, -1, 17], device=DEVICE)
    freqs = torch.arange(64).float()[:, None] * torch.rand(head_dim // 2, generator=g)[None, :]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1).to(dtype).to(DEVICE)
    norms = [torch.randn(head_dim, generator=g).to(dtype).to(DEVICE) for _ in range(2)]
    return qkv, q, k, v, positions, slots, cos_sin, norms


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("cache_dtype", ["model", "fp8"])
def test_rope_kv_write_equals_rope_then_store_kv(dtype, qk_norm, cache_dtype):
    head_dim = 64
    fp8 = cache_dtype == "fp8"
    scales = (0.37, 4.0) if fp8 else (1.0, 1.0)
    results = []
    for fused in (False, True):
        qkv, q, k, v, positions, slots, cos_sin, norms = make_step(dtype, head_dim, seed=4)
        weights = norms if qk_norm else [None, None]
        # [2, num_blocks, block_size, num_kv_heads, head_dim]; NaN where nothing may be written.
        cache = torch.full((2, 8, 4, 2, head_dim), float("nan"), dtype=dtype, device=DEVICE)
        cache = cache.to(FP8) if fp8 else cache
        write = KVWrite(v, cache, slots, *scales) if fused else None
        rotary_embedding(positions, q, k, cos_sin, *weights, 1e-6, kv_write=write)
        if not fused:
            store_kv(k, v, cache, slots, *scales)
        results.append((qkv.cpu(), cache.cpu().view(torch.uint8 if fp8 else dtype)))
    (qkv_ref, cache_ref), (qkv_got, cache_got) = results
    assert torch.equal(qkv_got, qkv_ref)  # q, k rotated alike, v untouched
    # Bitwise, NaNs included (the unwritten slots of both caches).
    assert torch.equal(cache_got.view(torch.uint8), cache_ref.view(torch.uint8))
    written = cache_ref.view(FP8).float() if fp8 else cache_ref
    assert not torch.isnan(written[:, 0, 0]).any()  # slot 0: K and V written
    assert torch.isnan(written[:, 0, 1]).all()  # slot 1: nobody's


def test_rope_kv_write_rejects_what_store_kv_rejects():
    qkv, q, k, v, positions, slots, cos_sin, _ = make_step(torch.float32, 64, seed=5)
    cache = torch.zeros(2, 8, 4, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping length"):
        rotary_embedding(positions, q, k, cos_sin, kv_write=KVWrite(v, cache, slots[:3]))
    with pytest.raises(ValueError, match="dtype"):
        rotary_embedding(positions, q, k, cos_sin, kv_write=KVWrite(v, cache.half(), slots))
    with pytest.raises(ValueError, match="fp8 cache only"):
        rotary_embedding(positions, q, k, cos_sin, kv_write=KVWrite(v, cache, slots, 2.0))
