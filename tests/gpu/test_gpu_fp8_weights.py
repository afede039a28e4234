"""GPU: block-FP8 weights. The token-group quantization's bytes against torch's, the FP8 GEMM
against the dequantizing reference in bf16 at Qwen3-8B's and a 27B shape's weights, a row's bits
alone and batched in deterministic mode, and the engine's greedy tokens with FP8 weights alone
and batched in deterministic mode (`pytest -m gpu tests/gpu/test_gpu_fp8_weights.py -s`)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# (N, K) of Qwen3-8B's qkv, o, gate_up, down and a 27B dense shape's gate_up and down.
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (34816, 5120), (5120, 17408)]
ROWS = [1, 16, 256, 4096]


def weights(n: int, k: int):
    from minivllm.layers.quantization.fp8_math import quantize_weight_blocks

    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", generator=gen) / k**0.5
    return quantize_weight_blocks(w)


@pytest.mark.parametrize("m,k", [(1, 4096), (300, 12288), (4096, 5120), (7, 200)])
def test_token_group_quant_bytes_equal_torch(m: int, k: int) -> None:
    from minivllm.kernels.fp8_gemm import quantize_token_groups
    from minivllm.layers.quantization.fp8_math import quantize_token_groups as reference

    gen = torch.Generator(device="cuda").manual_seed(1)
    x = (torch.randn(m, k, device="cuda", generator=gen) * 4).bfloat16()
    q, s = quantize_token_groups(x)
    q_ref, s_ref = reference(x)
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("n,k", SHAPES)
def test_fp8_gemm_matches_the_reference_in_bf16(n: int, k: int) -> None:
    from minivllm.kernels.fp8_gemm import block_fp8_linear
    from minivllm.layers.quantization.fp8_math import block_fp8_linear_ref

    wq, ws = weights(n, k)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for m in ROWS:
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        got = block_fp8_linear(x, wq, ws)
        expected = block_fp8_linear_ref(x.float(), wq, ws)  # float32 throughout
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        # bf16 output rounding (2**-8 relative) and float32 sums in another order.
        torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("n,k", SHAPES[:4])
def test_deterministic_rows_alone_and_batched_have_the_same_bits(n: int, k: int) -> None:
    from minivllm.kernels.fp8_gemm import block_fp8_linear

    wq, ws = weights(n, k)
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2048, k, device="cuda", generator=gen).bfloat16()
    full = block_fp8_linear(x, wq, ws, deterministic=True)
    for m in (1, 7, 16, 64, 300):
        part = block_fp8_linear(x[:m], wq, ws, deterministic=True)
        assert torch.equal(part, full[:m]), m


def test_engine_fp8_deterministic_tokens_alone_and_batched(model_dir: str) -> None:
    """Quantized at load; greedy tokens of each prompt alone equal those in a batch of 8."""
    from minivllm import LLM, SamplingParams

    llm = LLM(model_dir, quantization="fp8", deterministic=True, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts(8, 200)]
    together = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in batch]
    llm.shutdown()
    assert together == alone


@pytest.mark.parametrize("num_tokens", [1, 64, 2048])
def test_fp8_fused_moe_matches_the_reference(num_tokens: int) -> None:
    """Block-FP8 experts at Qwen3-30B-A3B's shape (128 experts, top-8, hidden 2048,
    intermediate 768) against the torch definition with the dequantizing FP8 GEMM."""
    from functools import partial

    from minivllm.kernels.moe.fused_moe import fused_moe
    from minivllm.layers.moe_experts import experts_torch
    from minivllm.layers.moe_router import route
    from minivllm.layers.quantization.fp8_math import block_fp8_linear_ref, quantize_weight_blocks

    experts, hidden, inter, top_k = 128, 2048, 768, 8
    gen = torch.Generator(device="cuda").manual_seed(4)

    def stacked(rows: int, cols: int):
        parts = [quantize_weight_blocks(torch.randn(rows, cols, device="cuda", generator=gen)
                                        / cols**0.5) for _ in range(experts)]  # fmt: skip
        return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])

    (w13, w13_scale), (w2, w2_scale) = stacked(2 * inter, hidden), stacked(hidden, inter)
    x = torch.randn(num_tokens, hidden, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(num_tokens, experts, device="cuda", generator=gen)
    topk_weights, topk_ids = route(logits, top_k, True)
    got = fused_moe(x, w13, w2, topk_weights, topk_ids, None, w13_scale, w2_scale)
    gemm = partial(block_fp8_linear_ref, gemm=torch.nn.functional.linear)
    ref = experts_torch(x.float(), w13, w2, topk_weights, topk_ids, gemm, (w13_scale, w2_scale))
    assert got.dtype == torch.bfloat16 and got.shape == (num_tokens, hidden)
    # The kernel rounds the activation to bf16 before quantizing it; the reference does not.
    assert float((got.float() - ref).norm() / ref.norm()) < 2e-2
