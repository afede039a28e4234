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
from minivllm.layers.tuned_gemm import TunedGemm


@dataclass(frozen=True)
class LayerOps:
    # F.linear (cuBLAS; on CUDA a TunedGemm: the Triton GEMM at the few small row counts where
    # it gives cuBLAS's bits faster); in deterministic mode the batch-invariant Triton GEMM
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
    On CUDA the GEMM is an InvariantGemm (deterministic, for steps of up to max_rows rows) or a
    TunedGemm: the runner verifies it once the model is built (`verify_model`)."""
    gemm: Gemm = F.linear
    on_cuda = device is not None and device.type == "cuda"
    if deterministic or on_cuda:
        from minivllm.kernels.matmul import matmul  # Triton: imported only when it runs

        if deterministic:
            gemm = InvariantGemm(matmul, max_rows) if on_cuda else matmul
        else:
            gemm = TunedGemm(matmul)
    return LayerOps(
        gemm=gemm,
        reduce=tp_all_reduce(symm, ordered=False),
        row_reduce=tp_all_reduce(symm, ordered=deterministic),
    )


DEFAULT_OPS = LayerOps()
