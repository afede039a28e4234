"""store_kv writes K/V rows at their slots, skips -1 rows, accepts strided views."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.kv_store import store_kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_kv_heads,head_dim,block_size", [(2, 64, 4), (1, 128, 16), (3, 80, 8)])
def test_store_kv_matches_indexing(dtype, num_kv_heads, head_dim, block_size):
    torch.manual_seed(0)
    num_blocks, num_tokens = 6, 9
    kv_cache = torch.zeros(
        2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=DEVICE
    )
    # k and v are views into one fused buffer, as after a qkv projection split.
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, device=DEVICE).to(dtype)
    k = qkv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(
        num_tokens, num_kv_heads, head_dim
    )
    v = qkv[:, 2 * num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[2, 7]] = -1
    store_kv(k, v, kv_cache, slots.to(DEVICE))

    expected = torch.zeros_like(kv_cache)
    flat = expected.view(2, -1, num_kv_heads, head_dim)
    valid = slots >= 0
    flat[0, slots[valid].to(DEVICE)] = k[valid.to(DEVICE)]
    flat[1, slots[valid].to(DEVICE)] = v[valid.to(DEVICE)]
    torch.testing.assert_close(kv_cache, expected, atol=0, rtol=0)


def test_store_kv_rejects_bad_input():
    kv_cache = torch.zeros(2, 4, 4, 2, 16, device=DEVICE)
    k = torch.zeros(3, 2, 16, device=DEVICE)
    slots = torch.zeros(3, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="dtype"):
        store_kv(k.half(), k.half(), kv_cache, slots)
    with pytest.raises(ValueError, match="kv_cache"):
        store_kv(k, k, kv_cache[:, :, :, :1], slots)
    with pytest.raises(ValueError, match="slot_mapping length"):
        store_kv(k, k, kv_cache, slots[:2])
    with pytest.raises(ValueError, match="block_size"):
        store_kv(k, k, torch.zeros(2, 4, 3, 2, 16, device=DEVICE), slots)
