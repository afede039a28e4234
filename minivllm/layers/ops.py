"""The GEMM and the all-reduces a model's layers call, chosen once per rank when it starts
(deterministic mode, the TP all-reduce) and handed to every linear layer, embedding and LM head
as they are built (docs/determinism.md, docs/parallelism.md)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.all_reduce import Reduce, SymmBuffer, tp_all_reduce
from minivllm.distributed.parallel_state import all_reduce
from minivllm.layers.invariant_gemm import Gemm, InvariantGemm
from minivllm.layers.quantization.fp8_math import BlockFp8Gemm, block_fp8_linear_ref
from minivllm.layers.tuned_gemm import TunedGemm


class LinearMethod(Protocol):
    """A quantized linear layer's weights and GEMM (layers/quantization/)."""

    def create_weights(self, layer: nn.Module) -> None:
        """Registers the layer's parameters (each with its weight_loader) for its
        input_size x output_size on this rank."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [num_tokens, input_size] -> [num_tokens, output_size] in x.dtype."""


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
    # The block-scaled FP8 GEMM (x, wq, ws, bias) -> y: the Triton kernel on CUDA
    # (kernels/fp8_gemm.py), the dequantizing torch reference on the CPU.
    block_fp8_gemm: BlockFp8Gemm = block_fp8_linear_ref
    # The linear layers' quantized method, set at build from the checkpoint's
    # quantization_config (model_loader.build_model); None: unquantized weights and `gemm`.
    linear_method: LinearMethod | None = None
    # The layers' (tp_rank, tp_size); None: torch.distributed's (each layer reads
    # `ops.tp or get_tp_rank_size()`). (0, 1) builds a whole model beside a sharded one: a
    # draft model on rank 0 (engine/runner/drafts/draft_model.py).
    tp: tuple[int, int] | None = None
    # Deterministic mode: kernels that pick their path by the step's size keep the one whose
    # bits do not depend on it (the fused MoE's grouped GEMMs, never its small-step GEMVs).
    batch_invariant: bool = False


def layer_ops(
    deterministic: bool,
    symm: SymmBuffer | None = None,
    device: torch.device | None = None,
    max_rows: int = 1,
    single_rank: bool = False,
) -> LayerOps:
    """The layers' ops: batch-invariant ones when `deterministic`; the symmetric-memory
    all-reduce where `symm` (this rank's buffer, or None: NCCL only) gives the same sums.
    On CUDA the GEMM is an InvariantGemm (deterministic, for steps of up to max_rows rows) or a
    TunedGemm: the runner verifies it once the model is built (`verify_model`). The FP8 GEMM
    is the Triton kernel on CUDA (one tile config per shape when deterministic), else the
    dequantizing reference over this mode's GEMM. single_rank: the layers are whole (TP rank
    0 of 1) whatever process group exists."""
    gemm: Gemm = F.linear
    on_cuda = device is not None and device.type == "cuda"
    fp8_gemm: BlockFp8Gemm = partial(block_fp8_linear_ref, gemm=F.linear)
    if deterministic or on_cuda:
        from minivllm.kernels.matmul import matmul  # Triton: imported only when it runs

        if deterministic:
            gemm = InvariantGemm(matmul, max_rows) if on_cuda else matmul
            fp8_gemm = partial(block_fp8_linear_ref, gemm=matmul)
        else:
            gemm = TunedGemm(matmul)
    if on_cuda:
        from minivllm.kernels.fp8_gemm import block_fp8_linear

        fp8_gemm = partial(block_fp8_linear, deterministic=deterministic)
    return LayerOps(
        gemm=gemm,
        reduce=tp_all_reduce(symm, ordered=False),
        row_reduce=tp_all_reduce(symm, ordered=deterministic),
        block_fp8_gemm=fp8_gemm,
        tp=(0, 1) if single_rank else None,
        batch_invariant=deterministic,
    )


DEFAULT_OPS = LayerOps()
