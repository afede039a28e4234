"""Could deterministic mode reduce K in segments? One JSON line that says, for a weight shape
(Qwen3-0.6B's `down` by default), whether a GEMM that sums K as C in-register chains (K cut
into C equal segments, each summed from zero in BLOCK_K steps, the segments added in order at
the end) is fast enough at every M.

Why: the mode needs one reduction order at every M (docs/determinism.md). Today that order is
one chain over K, which cuBLAS runs at large M; at one row cuBLAS splits K instead and is
faster than every one-chain GEMM tried (docs/determinism.md). C chains shorten the dependent
MMA chain C times at small M without a second launch; the price is at large M, where cuBLAS
cannot run one chain per segment: either C cuBLAS GEMMs on the K segments into float32,
added in order and rounded (`segments`), or the C-chain Triton GEMM itself.

Per M: `cublas` (F.linear, today's default), `one_chain` (kernels/matmul.py, the mode's
reference), `chains{C}` (the fastest of a few tiles; its config), `segments{C}` (cuBLAS on the
segments), in µs a call replayed in CUDA graphs; and the bit checks the route rests on: the
C-chain GEMM gives a row the same bits at every M (`rows_invariant`), and cuBLAS on the
segments gives the C-chain GEMM's bits (`segments_equal`).

    python benchmarks/probe_down_chains.py [--shape 1024x3072] [--chains 2,4]
        [--rows 1,2,4,8,64,256,1024,8192] [--gluon]

--gluon adds, at 256 rows and more, `gluon{C}` for C = 1, 2: the Gluon GEMM of
`gluon_chains_gemm.py` (TMA producer warp, two wgmma warpgroups; a program per SM, and
`_per_tile` a program per output tile), its time and whether it gives the bits of the
one-chain GEMM (C = 1) or of the C-chain Triton GEMM (`..._equal`).
It has never run on a GPU: a hang is possible, so run the probe under `timeout`.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from minivllm.kernels.matmul import matmul
from minivllm.layers.invariant_gemm import graph_us

# (block_m, block_n, block_k, num_warps, num_stages) tried per M: decode rows, then prefill.
SMALL = [(16, n, k, w, 3) for n in (16, 32, 64) for k in (64, 128, 256) for w in (2, 4)]
LARGE = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 2), (128, 64, 64, 4, 3), (64, 128, 64, 4, 3)]
LARGE += [(128, 128, 32, 8, 2), (64, 64, 64, 4, 2)]
# 64-row (wgmma) tiles for the row-invariance check, the first that fits shared memory.
CHECK = [(64, 64, 0, 4, 2), (64, 32, 0, 4, 1), (64, 16, 0, 4, 1)]


@triton.jit(do_not_specialize=["M"])  # one compile per config for every M
def _chains_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K_SEG, stride_xm, stride_wn, stride_ym,
    CHAINS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y = x @ w.T with K in CHAINS segments of K_SEG (a multiple of BLOCK_K): accumulator c
    sums segment c in BLOCK_K steps from zero; y = ((acc0 + acc1) + acc2) + acc3."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]
    acc0 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc3 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K_SEG, BLOCK_K):
        x = tl.load(x_ptrs + k0, mask=m_mask[:, None], other=0.0)
        w = tl.load(w_ptrs + k0, mask=n_mask[None, :], other=0.0)
        acc0 = tl.dot(x, w, acc0)
        if CHAINS > 1:
            x = tl.load(x_ptrs + K_SEG + k0, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs + K_SEG + k0, mask=n_mask[None, :], other=0.0)
            acc1 = tl.dot(x, w, acc1)
        if CHAINS > 2:
            x = tl.load(x_ptrs + 2 * K_SEG + k0, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs + 2 * K_SEG + k0, mask=n_mask[None, :], other=0.0)
            acc2 = tl.dot(x, w, acc2)
        if CHAINS > 3:
            x = tl.load(x_ptrs + 3 * K_SEG + k0, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs + 3 * K_SEG + k0, mask=n_mask[None, :], other=0.0)
            acc3 = tl.dot(x, w, acc3)
    acc = acc0
    if CHAINS > 1:
        acc = acc + acc1
    if CHAINS > 2:
        acc = acc + acc2
    if CHAINS > 3:
        acc = acc + acc3
    dst = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def chains_gemm(chains: int, config: tuple[int, int, int, int, int]):
    """F.linear(x, w) (no bias) by `_chains_kernel` with this tile config."""
    block_m, block_n, block_k, num_warps, num_stages = config

    def gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        (m, k), n = x.shape, w.shape[0]
        if chains > 4 or k % (chains * block_k):
            raise ValueError(f"K = {k} is not {chains} segments of whole {block_k}-steps")
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        _chains_kernel[grid](
            x, w, y, m, n, k // chains, x.stride(0), w.stride(0), y.stride(0),
            CHAINS=chains, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        return y

    return gemm


def segments_gemm(chains: int):
    """The same order from cuBLAS: one float32-output GEMM per K segment, added in order."""

    def gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        seg = x.shape[1] // chains
        total = None
        for c in range(chains):
            part = torch.mm(
                x[:, c * seg : (c + 1) * seg],
                w[:, c * seg : (c + 1) * seg].t(),
                out_dtype=torch.float32,
            )
            total = part if total is None else total + part
        return total.to(x.dtype)

    return gemm


def first_that_runs(configs, make, *inputs) -> torch.Tensor:
    """make(config)(*inputs) of the first config that compiles and runs."""
    for config in configs:
        try:
            return make(config)(*inputs)
        except Exception:  # noqa: BLE001 (a tile the GPU cannot hold: next one)
            continue
    raise RuntimeError(f"none of {configs} runs")


def fastest(configs, make, x, w) -> tuple[float, tuple | None]:
    """(µs, config) of the fastest config that compiles and runs."""
    best = (float("inf"), None)
    for config in configs:
        try:
            us = graph_us(make(config), x, w, None)
        except Exception:  # noqa: BLE001 (a tile the GPU cannot hold: next one)
            continue
        best = min(best, (us, config))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1024x3072", help="N x K of the weight")
    parser.add_argument("--chains", default="2,4")
    parser.add_argument("--rows", default="1,2,4,8,64,256,1024,8192")
    parser.add_argument("--gluon", action="store_true", help="also the Gluon GEMM (see above)")
    args = parser.parse_args()
    n, k = map(int, args.shape.split("x"))
    chain_counts = [int(c) for c in args.chains.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(n, k, device=dev, generator=gen).to(torch.bfloat16)
    x_all = torch.randn(max(rows), k, device=dev, generator=gen).to(torch.bfloat16)
    result = {"shape": [n, k], "gpu": torch.cuda.get_device_name(), "rows": {}}
    for m in rows:
        x = x_all[:m]
        entry = {
            "cublas": graph_us(F.linear, x, w, None),
            "one_chain": graph_us(matmul, x, w, None),
        }
        configs = SMALL if m <= 64 else LARGE
        for c in chain_counts:
            us, config = fastest(configs, lambda cfg, c=c: chains_gemm(c, cfg), x, w)
            entry[f"chains{c}"], entry[f"chains{c}_config"] = us, config
            entry[f"segments{c}"] = graph_us(segments_gemm(c), x, w, None)
            if config is not None:
                ref = chains_gemm(c, config)(x, w)
                # the same rows among many, in 64-row tiles of the same BLOCK_K
                checks = [(bm, bn, config[2], nw, ns) for bm, bn, _, nw, ns in CHECK]
                whole = first_that_runs(checks, lambda cfg, c=c: chains_gemm(c, cfg), x_all, w)
                whole = whole[:m]
                entry[f"chains{c}_rows_invariant"] = torch.equal(ref, whole)
                entry[f"segments{c}_equal"] = torch.equal(segments_gemm(c)(x, w), ref)
        if args.gluon and m >= 256:
            from gluon_chains_gemm import gluon_chains_gemm

            for c in (1, 2):
                config = entry.get(f"chains{c}_config")
                ref = matmul(x, w) if c == 1 else config and chains_gemm(c, config)(x, w)
                for name, persistent in ((f"gluon{c}", True), (f"gluon{c}_per_tile", False)):
                    gemm = gluon_chains_gemm(c, persistent=persistent)
                    entry[name] = graph_us(gemm, x, w, None)
                    if ref is not None:
                        entry[f"{name}_equal"] = torch.equal(gemm(x, w), ref)
        result["rows"][m] = {
            key: round(v, 2) if isinstance(v, float) else v for key, v in entry.items()
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
