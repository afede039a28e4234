"""The GEMM and the all-reduces a model's layers call, chosen once per rank when it starts
(deterministic mode, the TP all-reduce) and handed to every linear layer, embedding and LM head
as they are built (docs/determinism.md, docs/parallelism.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.distributed.all_reduce import Reduce, SymmBuffer, tp_all_reduce
from minivllm.distributed.parallel_state import all_reduce
from minivllm.layers.invariant_gemm import Gemm, InvariantGemm


@dataclass(frozen=True)
class LayerOps:
    # F.linear (cuBLAS); in deterministic mode the batch-invariant Triton GEMM
    # (kernels/matmul.py), on CUDA behind cuBLAS where it gives the same bits (InvariantGemm).
    gemm: Gemm = F.linear
    # The embedding's sum over ranks: one rank holds each row, so any order gives its bits.
    reduce: Reduce = all_reduce
    # Row-parallel partial sums: in deterministic mode added in rank order, in float32.
    row_reduce: Reduce = all_reduce


def layer_ops(
    deterministic: bool,
    symm: SymmBuffer | None = None,
    device: torch.device | None = None,
    max_rows: int = 1,
) -> LayerOps:
    """The layers' ops: batch-invariant ones when `deterministic`; the symmetric-memory
    all-reduce where `symm` (this rank's buffer, or None: NCCL only) gives the same sums.
    On CUDA the deterministic GEMM is an InvariantGemm for steps of up to max_rows rows: the
    runner verifies it once the model is built (InvariantGemm.verify_model)."""
    gemm: Gemm = F.linear
    if deterministic:
        from minivllm.kernels.matmul import matmul  # Triton: imported only when it runs

        gemm = matmul
        if device is not None and device.type == "cuda":
            gemm = InvariantGemm(matmul, max_rows)
    return LayerOps(
        gemm=gemm,
        reduce=tp_all_reduce(symm, ordered=False),
        row_reduce=tp_all_reduce(symm, ordered=deterministic),
    )


DEFAULT_OPS = LayerOps()
