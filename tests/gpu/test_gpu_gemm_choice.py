"""GPU: the default mode's GEMM (TunedGemm) gives cuBLAS's bits at every row count, at the small
ones where it may take the Triton GEMM and elsewhere, on Qwen3-0.6B's and Qwen3-8B's decode
shapes; deterministic mode's (InvariantGemm) keeps the Triton GEMM's bits with its timed
choice at the small rungs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SHAPES = [(1024, 2048), (1024, 3072), (4096, 1024), (6144, 1024), (4096, 4096), (24576, 4096)]


def _operands(n: int, k: int, rows: int):
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
    return x, w


def test_tuned_gemm_has_cublas_bits_at_every_row_count() -> None:
    from minivllm.kernels.matmul import matmul
    from minivllm.layers.invariant_gemm import SMALL_ROWS
    from minivllm.layers.tuned_gemm import TunedGemm

    gemm = TunedGemm(matmul)
    gemm.verify([(n, k, torch.bfloat16, False) for n, k in SHAPES], torch.device("cuda"))
    for n, k in SHAPES:
        x, w = _operands(n, k, 64)
        for rows in (*SMALL_ROWS, 3, 16, 64):
            assert torch.equal(gemm(x[:rows], w), F.linear(x[:rows], w)), (n, k, rows)


def test_invariant_gemm_has_the_triton_bits_at_every_small_row_count() -> None:
    from minivllm.kernels.matmul import matmul
    from minivllm.layers.invariant_gemm import SMALL_ROWS, InvariantGemm

    gemm = InvariantGemm(matmul, max_rows=64)
    gemm.verify([(n, k, torch.bfloat16, False) for n, k in SHAPES], torch.device("cuda"))
    for n, k in SHAPES:
        x, w = _operands(n, k, 64)
        for rows in (*SMALL_ROWS, 3, 16, 64):
            assert torch.equal(gemm(x[:rows], w), matmul(x[:rows], w)), (n, k, rows)
