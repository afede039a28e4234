"""The block-scaled FP8 GEMM (kernels/fp8_gemm.py) against the torch reference
(layers/quantization/fp8_math.py): the token-group quantization, the GEMM over ragged M, N and K
(partial blocks, bias), a row's result whatever rows are beside it; in the interpreter on the
CPU (float32 activations, small shapes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from paged_case import DEVICE

from minivllm.kernels.fp8_gemm import block_fp8_linear, block_fp8_matmul, quantize_token_groups
from minivllm.kernels.fp8_gemm_configs import fp8_gemm_config, rule_buckets
from minivllm.kernels.moe.align import align_by_expert
from minivllm.kernels.moe.configs import GemmTile
from minivllm.kernels.moe.grouped_gemm import grouped_gemm
from minivllm.layers.quantization.fp8_math import (
    block_fp8_linear_ref,
    dequantize_blocks,
    dequantize_token_groups,
    quantize_weight_blocks,
)
from minivllm.layers.quantization.fp8_math import quantize_token_groups as quantize_ref

CONFIG = (16, 32, 4, 1)  # several row and column tiles in the interpreter
E4M3 = torch.float8_e4m3fn


def data(m: int, k: int, n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(DEVICE)
    wq, ws = quantize_weight_blocks(torch.randn(n, k, generator=gen) / k**0.5)
    return x, wq.to(DEVICE), ws.to(DEVICE), torch.randn(n, generator=gen).to(DEVICE)


@pytest.mark.parametrize("m,k", [(3, 256), (5, 200), (1, 64)])
def test_token_group_quant_matches_torch(m, k) -> None:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(DEVICE) * 3
    q, s = quantize_token_groups(x)
    q_ref, s_ref = quantize_ref(x.cpu())
    assert q.dtype == E4M3 and s.shape == (m, -(-k // 128))
    torch.testing.assert_close(s.cpu(), s_ref, atol=0, rtol=0)
    got, ref = q.cpu().float(), q_ref.float()
    differ = got != ref
    if DEVICE == "cpu":
        # Triton's interpreter drops the carry when e4m3 rounding goes up into the next power of
        # two (x / s in [120, 128) gives 64, not 128); nothing else may differ. On a GPU: none.
        mantissa, _ = torch.frexp(ref[differ])
        assert torch.all((mantissa.abs() == 0.5) & (got[differ] == ref[differ] / 2))
    else:
        assert not differ.any()


@pytest.mark.parametrize("m,k,n", [(1, 256, 64), (7, 384, 160), (20, 200, 72), (0, 128, 32)])
def test_gemm_matches_the_dequantized_product(m, k, n) -> None:
    x, wq, ws, b = data(m, k, n)
    xq, xs = quantize_ref(x.cpu())
    for bias in (None, b):
        got = block_fp8_matmul(xq.to(DEVICE), xs.to(DEVICE), wq, ws, bias, torch.float32, CONFIG)
        expected = dequantize_token_groups(xq, xs) @ dequantize_blocks(wq.cpu(), ws.cpu()).T
        if bias is not None:
            expected += bias.cpu()
        assert got.shape == (m, n) and got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


def test_linear_matches_the_reference_and_a_row_ignores_its_neighbours() -> None:
    x, wq, ws, b = data(9, 256, 96)
    got = block_fp8_linear(x.view(3, 3, 256), wq, ws, b, config=CONFIG)
    assert got.shape == (3, 3, 96)
    if DEVICE == "cpu":  # the interpreter's e4m3 carry (above): the reference from its rounding
        xq, xs = quantize_token_groups(x)
        xd = dequantize_token_groups(xq.cpu(), xs.cpu())
        ref = xd @ dequantize_blocks(wq.cpu(), ws.cpu()).T + b.cpu()
    else:
        ref = block_fp8_linear_ref(x.cpu(), wq.cpu(), ws.cpu(), b.cpu())
    torch.testing.assert_close(got.reshape(9, 96).cpu(), ref, atol=1e-4, rtol=1e-4)
    for i in (0, 4, 8):
        alone = block_fp8_linear(x[i : i + 1], wq, ws, b, config=CONFIG)
        assert torch.equal(alone, got.reshape(9, 96)[i : i + 1])


def test_bad_inputs_name_the_tensor() -> None:
    x, wq, ws, _ = data(2, 256, 64)
    with pytest.raises(ValueError, match="weight has dtype"):
        block_fp8_linear(x, wq.float(), ws)
    with pytest.raises(ValueError, match=r"weight_scale shape \(\(1, 1\)\)"):
        block_fp8_linear(x, wq, ws[:, :1].contiguous())
    with pytest.raises(ValueError, match="x last dim"):
        block_fp8_linear(x[:, :128], wq, ws)


def test_configs_decode_prefill_and_deterministic() -> None:
    assert fp8_gemm_config(4096, 4096, 1)[0] == 16  # decode rows: 16-row tiles
    assert fp8_gemm_config(4096, 4096, 4096) == rule_buckets(4096)[-1][1]
    # Deterministic: one config per shape, whatever M (a row's bits cannot change with it).
    configs = {fp8_gemm_config(4096, 12288, m, deterministic=True) for m in (1, 16, 300, 8192)}
    assert len(configs) == 1


def expert_blocks(num_experts: int, rows: int, cols: int, gen):
    """Per-expert block-FP8 weights [E, rows, cols] and scales, and their float32 values."""
    parts = [quantize_weight_blocks(torch.randn(rows, cols, generator=gen) / cols**0.5)
             for _ in range(num_experts)]  # fmt: skip
    wq = torch.stack([q for q, _ in parts])
    ws = torch.stack([s for _, s in parts])
    deq = torch.stack([dequantize_blocks(q, s) for q, s in parts])
    return wq.to(DEVICE), ws.to(DEVICE), deq


def test_fp8_grouped_gemm_matches_the_dequantized_experts() -> None:
    """The MoE grouped GEMM's block-FP8 variant: gate/up with SiLU-and-mul over rows gathered
    by token, then down weighted by pair, against each pair's dequantized product (inputs
    rounded by the torch reference)."""
    gen = torch.Generator().manual_seed(5)
    num_experts, hidden, inter, top_k, num_tokens = 4, 200, 128, 2, 7
    w13q, w13s, w13 = expert_blocks(num_experts, 2 * inter, hidden, gen)
    w2q, w2s, w2 = expert_blocks(num_experts, hidden, inter, gen)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(7)])
    weights = torch.rand(num_tokens * top_k, generator=gen)
    blocks = align_by_expert(ids.int().to(DEVICE), num_experts, 16)
    tile = GemmTile(32, 128, 4, 1)
    xq, xs = quantize_ref(torch.randn(num_tokens, hidden, generator=gen))
    act = grouped_gemm(xq.to(DEVICE), w13q, blocks, tile, top_k, True, None,
                       (xs.to(DEVICE), w13s), torch.float32)  # fmt: skip
    xd, experts = dequantize_token_groups(xq, xs), ids.reshape(-1)
    gate_up = torch.stack([xd[p // top_k] @ w13[experts[p]].T for p in range(len(experts))])
    expected = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    torch.testing.assert_close(act.cpu(), expected, atol=1e-4, rtol=1e-4)
    aq, a_scale = quantize_ref(expected)
    y = grouped_gemm(aq.to(DEVICE), w2q, blocks, tile, 1, False, weights.to(DEVICE),
                     (a_scale.to(DEVICE), w2s), torch.float32)  # fmt: skip
    ad = dequantize_token_groups(aq, a_scale)
    expected = torch.stack([ad[p] @ w2[experts[p]].T for p in range(len(experts))])
    torch.testing.assert_close(y.cpu(), expected * weights[:, None], atol=1e-4, rtol=1e-4)
