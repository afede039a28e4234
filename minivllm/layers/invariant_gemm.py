"""Deterministic mode's GEMM on CUDA: cuBLAS wherever it gives the batch-invariant GEMM's bits.

The Triton GEMM (kernels/matmul.py) is batch-invariant by construction: each output element is
one in-order chain of MMA k-steps, wherever its row sits and however many rows there are. A
cuBLAS kernel without split-K (or stream-K) runs the same chain, and on the H200 gives the same
bits (docs/determinism.md); with split-K it does not. Which kernel cuBLAS picks depends on the
row count and the library, and nothing promises the bits, so they are checked, not assumed:

- every call pads its rows up to a rung of a fixed ladder (`gemm_ladder`), so cuBLAS only ever
  runs at a finite set of row counts;
- when the model is built, `verify` runs cuBLAS and the Triton GEMM for each weight shape of
  the model at every rung on random inputs and keeps the rungs where every row has the same
  bits in both;
- a call runs cuBLAS at such a rung, at a rung that failed it runs cuBLAS padded to the next
  rung that passed if that adds at most an eighth of the rows (padding changes no row's bits),
  and the Triton GEMM otherwise (a shape nobody verified, or no passing rung near). Every row
  therefore has the Triton GEMM's bits, whatever its batch.
  Rows past the largest rung checked (the LM head's are capped by the check's memory) go in
  chunks of that rung.

cuBLAS is the faster of the two at most shapes (measured: docs/determinism.md), not all: at a
few small row counts (SMALL_ROWS) the two are also timed, and where the Triton GEMM takes at most
FASTER of cuBLAS's time it runs there instead (same bits either way). The default mode makes
the same choice the other way round (layers/tuned_gemm.py), with this module's check and
timer.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

# The check's output at its largest rung is at most this many bytes (it holds two).
CHECK_BYTES = 512 << 20
# Row counts at which both GEMMs are also timed (batch-1 and small-batch decode), and the share
# of the other's time at which the Triton GEMM is taken instead of cuBLAS: a wide margin, so
# that timing noise never flips a choice.
SMALL_ROWS = (1, 2, 4, 8)
FASTER = 0.8
# A rung where cuBLAS missed the bits runs cuBLAS at the next rung where it matched if that has
# at most this many times its rows: at large M the Triton GEMM takes 1.4-1.5x cuBLAS's time
# (docs/determinism.md), at small M a GEMM reads its weight whatever the rows.
NEXT_RUNG_AT_MOST = 1.125

# (x [num_tokens, in], weight [out, in], bias [out] | None) -> [num_tokens, out]
Gemm = Callable[..., torch.Tensor]
# (N, K, dtype, has_bias) of a weight as the GEMM sees it.
ShapeKey = tuple[int, int, torch.dtype, bool]
# (gemm, x, weight, bias) -> microseconds a call
Timer = Callable[[Gemm, torch.Tensor, torch.Tensor, torch.Tensor | None], float]


def gemm_ladder(max_rows: int) -> list[int]:
    """The row counts cuBLAS runs at: 1, 2, 4, every 8 to 256, every 16 to 1,024 (the decode
    graphs' sizes), every 64 to 2,048, every 256 beyond (the mixed-step graphs' sizes); the
    last rung is the first of them >= max_rows. Padding adds at most ~12 %."""
    rungs = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 1025, 16))
    rungs += list(range(1088, 2049, 64))
    top = max(max_rows, 1)
    while rungs[-1] < top:
        rungs.append(rungs[-1] + 256 if rungs[-1] >= 2048 else rungs[-1] + 64)
    return [r for r in rungs if r < top] + [next(r for r in rungs if r >= top)]


def operands(
    n: int, k: int, dtype: torch.dtype, has_bias: bool, rows: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random x [rows, k], weight [n, k] and (if has_bias) bias [n] of the shape, seeded."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, k, device=device, dtype=dtype, generator=gen)
    w = torch.randn(n, k, device=device, dtype=dtype, generator=gen) / k**0.5
    b = torch.randn(n, device=device, dtype=dtype, generator=gen) if has_bias else None
    return x, w, b


def rungs_matching(
    gemm: Gemm,
    reference: Gemm,
    n: int,
    k: int,
    dtype: torch.dtype,
    has_bias: bool,
    rungs: list[int],
    device: torch.device,
) -> list[int]:
    """The rungs at which gemm gives every row the bits `reference` gives it (random inputs of
    the shape: weight [n, k], a bias if has_bias, rungs[-1] rows at most)."""
    x, w, b = operands(n, k, dtype, has_bias, rungs[-1], device)
    return [m for m in rungs if torch.equal(gemm(x[:m], w, b), reference(x[:m], w, b))]


def rungs_to_run(rungs: list[int], matched: Iterable[int]) -> dict[int, int]:
    """rung -> the rung the fast GEMM runs it at: itself where it matched, else the next rung
    that matched if it has at most NEXT_RUNG_AT_MOST times the rows; rungs with neither are
    left out (they run the reference)."""
    matched = sorted(matched)
    run_at = {}
    for rung in rungs:
        i = bisect.bisect_left(matched, rung)
        if i < len(matched) and matched[i] <= rung * NEXT_RUNG_AT_MOST:
            run_at[rung] = matched[i]
    return run_at


def graph_us(gemm: Gemm, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> float:
    """Microseconds a call of gemm(x, w, b) takes replayed in a CUDA graph, as the engine's
    decode steps run it (no launch host time), after a first call that compiles it."""
    reps, rounds = 20, 5
    gemm(x, w, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            gemm(x, w, b)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(rounds):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * rounds)


def clearly_faster(
    gemm: Gemm, other: Gemm, key: ShapeKey, rows: int, device: torch.device, timer: Timer
) -> bool:
    """Whether gemm takes at most FASTER of other's time at this shape and row count."""
    n, k, dtype, has_bias = key
    x, w, b = operands(n, k, dtype, has_bias, rows, device)
    return timer(gemm, x, w, b) <= FASTER * timer(other, x, w, b)


def model_shapes(model: torch.nn.Module, gemm: Gemm) -> set[ShapeKey]:
    """The weight shapes of every layer of `model` that calls `gemm` (a layer with a bias also
    without it: under TP only rank 0 adds a row-parallel bias)."""
    shapes = set()
    for module in model.modules():
        if getattr(module, "gemm", None) is not gemm:
            continue
        weight, bias = module.weight, getattr(module, "bias", None)
        shapes.add((weight.shape[0], weight.shape[1], weight.dtype, False))
        if bias is not None:
            shapes.add((weight.shape[0], weight.shape[1], weight.dtype, True))
    return shapes


def default_timer(device: torch.device) -> Timer | None:
    """graph_us on CUDA; no timing elsewhere (the CPU path has one GEMM)."""
    return graph_us if device.type == "cuda" else None


class InvariantGemm:
    """gemm(x, weight, bias=None) -> [rows, N]: `fast` (cuBLAS) at the rungs where it matched
    `reference` (the batch-invariant Triton GEMM) or padded to one near, `reference` everywhere
    else."""

    def __init__(
        self, reference: Gemm, max_rows: int, fast: Gemm = F.linear, timer: Timer | None = None
    ) -> None:
        self.reference = reference
        self.fast = fast
        self.timer = timer  # None: default_timer(device) at verify
        self.ladder = gemm_ladder(max_rows)
        # Verified shapes -> (each rung that runs fast -> the rung it runs at), and the largest
        # rung checked.
        self.run_at: dict[ShapeKey, dict[int, int]] = {}
        self.top_rung: dict[ShapeKey, int] = {}

    def verify(self, shapes: Iterable[ShapeKey], device: torch.device) -> dict[ShapeKey, int]:
        """Checks each shape at every rung its memory allows; returns shape -> how many rungs
        run `fast`. At the SMALL_ROWS rungs where both match, `fast` also has to be the
        faster one (the reference runs where it is clearly faster)."""
        timer = self.timer or default_timer(device)
        counts = {}
        for key in sorted(set(shapes), key=str):
            n, k, dtype, has_bias = key
            cap = max(1, CHECK_BYTES // (n * dtype.itemsize))
            rungs = [r for r in self.ladder if r <= cap] or [1]
            same = rungs_matching(self.fast, self.reference, n, k, dtype, has_bias, rungs, device)
            if timer is not None:
                same = [
                    r
                    for r in same
                    if r not in SMALL_ROWS
                    or not clearly_faster(self.reference, self.fast, key, r, device, timer)
                ]
            self.run_at[key] = rungs_to_run(rungs, same)
            self.top_rung[key] = rungs[-1]
            counts[key] = len(same)
        return counts

    def matched_rungs(self, key: ShapeKey) -> frozenset[int]:
        """The rungs where `fast` matched the reference (and was kept) for a verified shape."""
        return frozenset(r for r, at in self.run_at[key].items() if r == at)

    def verify_model(self, model: torch.nn.Module, device: torch.device) -> None:
        """Verifies the shapes of every layer of `model` that calls this GEMM."""
        for key, count in self.verify(model_shapes(model, self), device).items():
            n, k, dtype, has_bias = key
            checked = bisect.bisect_right(self.ladder, self.top_rung[key])
            logger.info(
                "deterministic GEMM %dx%d %s%s: cuBLAS at %d of %d row counts (%d more padded "
                "to one of them), Triton elsewhere",
                n, k, str(dtype).removeprefix("torch."), " + bias" if has_bias else "", count,
                checked, len(self.run_at[key]) - count,
            )  # fmt: skip
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the check's buffers

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        key = (weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
        run_at = self.run_at.get(key)
        rows = x.shape[0]
        if not run_at or x.dim() != 2 or rows == 0:
            return self.reference(x, weight, bias)
        top = self.top_rung[key]
        if rows <= top:
            return self._at_rung(x, weight, bias, run_at)
        parts = [self._at_rung(x[i : i + top], weight, bias, run_at) for i in range(0, rows, top)]
        return torch.cat(parts)

    def _at_rung(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        run_at: dict[int, int],
    ) -> torch.Tensor:
        rows = x.shape[0]
        rung = run_at.get(self.ladder[bisect.bisect_left(self.ladder, rows)])
        if rung is None:
            return self.reference(x, weight, bias)
        if rung == rows:
            return self.fast(x, weight, bias)
        # Rows are independent (every row matched the reference), so the padding rows may hold
        # anything: one copy, no fill.
        padded = x.new_empty(rung, x.shape[1])
        padded[:rows] = x
        return self.fast(padded, weight, bias)[:rows]
