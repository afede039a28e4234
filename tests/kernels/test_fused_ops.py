"""RMSNorm (+ residual), RoPE (+ Qwen3 q/k norm) and SiLU-mul vs their torch definitions."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.activation import silu_and_mul
from minivllm.kernels.rmsnorm import rms_norm
from minivllm.kernels.rope import rotary_embedding

DTYPES = [torch.float32, torch.float16]


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}


def ref_rms_norm(x, weight, eps):
    """The HF definition: fp32 statistics, cast back, then scale."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def ref_rope(x, positions, cos_sin_cache):
    half = x.shape[-1] // 2
    cos = cos_sin_cache[positions, :half].float()[:, None, :]
    sin = cos_sin_cache[positions, half:].float()[:, None, :]
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def make_cos_sin_cache(max_pos, head_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], -1)  # [max_pos, head_dim]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 100])
def test_rms_norm(dtype, hidden):
    torch.manual_seed(0)
    x = (torch.randn(5, hidden) * 3).to(dtype)
    weight = torch.randn(hidden).to(dtype)
    out, new_res = rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6)
    assert new_res is None
    torch.testing.assert_close(out.cpu(), ref_rms_norm(x, weight, 1e-6), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_fused_residual(dtype):
    torch.manual_seed(1)
    wide = torch.randn(4, 96).to(dtype)
    x = wide[:, :64]  # strided rows
    residual = torch.randn(4, 64).to(dtype)
    weight = torch.randn(64).to(dtype)
    out, new_res = rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-5, residual.to(DEVICE))
    summed = x + residual
    torch.testing.assert_close(new_res.cpu(), summed, atol=0, rtol=0)
    torch.testing.assert_close(out.cpu(), ref_rms_norm(summed, weight, 1e-5), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_in_place(dtype, head_dim):
    torch.manual_seed(2)
    num_tokens, num_heads, num_kv_heads = 5, 4, 2
    cache = make_cos_sin_cache(64, head_dim)
    positions = torch.tensor([0, 3, 17, 63, 3])
    # q and k are views into one qkv buffer, as after the fused projection.
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    k = k.view(num_tokens, num_kv_heads, head_dim)
    expected_q, expected_k = ref_rope(q, positions, cache), ref_rope(k, positions, cache)
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()
    qkv_dev = qkv.to(DEVICE)
    q_dev = qkv_dev[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k_dev = qkv_dev[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    k_dev = k_dev.view(num_tokens, num_kv_heads, head_dim)
    rotary_embedding(positions.to(DEVICE), q_dev, k_dev, cache.to(DEVICE))
    torch.testing.assert_close(q_dev.cpu(), expected_q, **_tol(dtype))
    torch.testing.assert_close(k_dev.cpu(), expected_k, **_tol(dtype))
    assert torch.equal(qkv_dev[:, (num_heads + num_kv_heads) * head_dim :].cpu(), v_before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_with_qk_norm(dtype):
    torch.manual_seed(3)
    head_dim, eps = 64, 1e-6
    cache = make_cos_sin_cache(32, head_dim)
    positions = torch.tensor([1, 30, 7])
    q = (torch.randn(3, 4, head_dim) * 2).to(dtype)
    k = (torch.randn(3, 2, head_dim) * 2).to(dtype)
    q_w, k_w = torch.randn(head_dim).to(dtype), torch.randn(head_dim).to(dtype)
    expected_q = ref_rope(ref_rms_norm(q, q_w, eps), positions, cache)
    expected_k = ref_rope(ref_rms_norm(k, k_w, eps), positions, cache)
    q_dev, k_dev = q.to(DEVICE), k.to(DEVICE)
    rotary_embedding(
        positions.to(DEVICE), q_dev, k_dev, cache.to(DEVICE), q_w.to(DEVICE), k_w.to(DEVICE), eps
    )
    torch.testing.assert_close(q_dev.cpu(), expected_q, **_tol(dtype))
    torch.testing.assert_close(k_dev.cpu(), expected_k, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [32, 1500])
def test_silu_and_mul(dtype, inter):
    torch.manual_seed(4)
    x = (torch.randn(3, 2 * inter) * 3).to(dtype)
    expected = (torch.nn.functional.silu(x[:, :inter].float()) * x[:, inter:].float()).to(dtype)
    torch.testing.assert_close(silu_and_mul(x.to(DEVICE)).cpu(), expected, **_tol(dtype))


def test_fused_ops_reject_bad_input():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.zeros(2, 5, device=DEVICE))
    with pytest.raises(ValueError, match="weight"):
        rms_norm(torch.zeros(2, 8, device=DEVICE), torch.zeros(4, device=DEVICE), 1e-6)
    q = torch.zeros(2, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rotary_embedding(
            torch.zeros(2, dtype=torch.long, device=DEVICE), q, q, torch.zeros(8, 8, device=DEVICE)
        )
    with pytest.raises(ValueError, match="both"):
        rotary_embedding(torch.zeros(2, dtype=torch.long), q, q, torch.zeros(8, 16), q[0, 0])
