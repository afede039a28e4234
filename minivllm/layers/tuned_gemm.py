"""The default mode's GEMM on CUDA: cuBLAS (`F.linear`), except at the few small row counts
(`SMALL_ROWS`, batch-1 and small-batch decode) where, for a weight shape of the model, the Triton
GEMM (kernels/matmul.py) gives cuBLAS's bits in at most `FASTER` of its time. Checked and timed
once the model is built, with deterministic mode's check and timer (layers/invariant_gemm.py).
Where it pays: docs/performance.md (batch 1)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from minivllm.layers.invariant_gemm import (
    SMALL_ROWS,
    Gemm,
    ShapeKey,
    Timer,
    clearly_faster,
    default_timer,
    model_shapes,
    rungs_matching,
)

logger = logging.getLogger(__name__)


class TunedGemm:
    """gemm(x, weight, bias=None) -> [rows, N]: `alternative` (the Triton GEMM) at the
    (shape, row count) pairs `verify` found with cuBLAS's bits and clearly faster, cuBLAS
    everywhere else. Same bits as cuBLAS everywhere, so outputs do not depend on the choice."""

    def __init__(self, alternative: Gemm, cublas: Gemm = F.linear, timer: Timer | None = None):
        self.alternative = alternative
        self.cublas = cublas
        self.timer = timer  # None: default_timer(device) at verify
        self.alternative_at: set[tuple[ShapeKey, int]] = set()

    def verify(self, shapes: Iterable[ShapeKey], device: torch.device) -> None:
        """Checks and times each shape at SMALL_ROWS (on CUDA, or with a timer given). Where
        the Triton GEMM cannot run at all (a GPU its compiler does not take), cuBLAS stays
        everywhere."""
        timer = self.timer or default_timer(device)
        if timer is None:
            return
        chosen = set()
        try:
            for key in sorted(set(shapes), key=str):
                n, k, dtype, has_bias = key
                rows = list(SMALL_ROWS)
                same = rungs_matching(
                    self.alternative, self.cublas, n, k, dtype, has_bias, rows, device
                )
                for r in same:
                    if clearly_faster(self.alternative, self.cublas, key, r, device, timer):
                        chosen.add((key, r))
        except Exception as err:  # noqa: BLE001 - any compile or launch error of that GEMM
            logger.warning("the Triton GEMM cannot run here (%s): cuBLAS at every row count", err)
            return
        self.alternative_at |= chosen

    def verify_model(self, model: torch.nn.Module, device: torch.device) -> None:
        self.verify(model_shapes(model, self), device)
        for (n, k, dtype, has_bias), rows in sorted(self.alternative_at, key=str):
            logger.info(
                "GEMM %dx%d %s%s at %d rows: the Triton GEMM (cuBLAS's bits, faster)",
                n, k, str(dtype).removeprefix("torch."), " + bias" if has_bias else "", rows,
            )  # fmt: skip
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.alternative_at and x.dim() == 2:
            key = (weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
            if (key, x.shape[0]) in self.alternative_at:
                return self.alternative(x, weight, bias)
        return self.cublas(x, weight, bias)
