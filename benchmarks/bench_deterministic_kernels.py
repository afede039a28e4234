"""Deterministic mode's kernels against the default ones (GPU, bf16, Qwen3-0.6B shapes): decode
and prefill attention, and the GEMMs of one layer plus the LM head at decode and prefill M.
Prints one JSON line per case. For the config search and the cost breakdown see
benchmarks/tune_deterministic.py.

python benchmarks/bench_deterministic_kernels.py
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from minivllm.kernels.batch_invariant_attention import SEG_N, batch_invariant_attention
from minivllm.kernels.decode_attention import choose_num_splits, decode_attention
from minivllm.kernels.matmul import matmul
from minivllm.kernels.prefill_attention import prefill_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16
GEMMS = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024),
         "lm_head": (1024, 151936)}  # fmt: skip


def paged(num_seqs: int, ctx: int):
    blocks = -(-ctx // BLOCK)
    cache = torch.randn(2, num_seqs * blocks + 1, BLOCK, KV_HEADS, HEAD_DIM, device="cuda")
    table = torch.randperm(num_seqs * blocks, device="cuda").int().view(num_seqs, blocks) + 1
    return cache.bfloat16(), table


def bench_decode(num_seqs: int, ctx: int) -> dict:
    cache, table = paged(num_seqs, ctx)
    q = torch.randn(num_seqs, HEADS, HEAD_DIM, device="cuda").bfloat16()
    lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device="cuda")
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device="cuda")
    out, scale = torch.empty_like(q), HEAD_DIM**-0.5
    splits = choose_num_splits(num_seqs, KV_HEADS, ctx, 132)
    mid_o = torch.empty(num_seqs, HEADS, 16, HEAD_DIM, device="cuda")
    mid_lse = torch.empty(num_seqs, HEADS, 16, device="cuda")
    segs = -(-ctx // SEG_N) if num_seqs * KV_HEADS < 132 and ctx > SEG_N else 0
    shape = (num_seqs, HEADS, max(segs, 1))
    parts = {
        "part_acc": torch.empty(*shape, HEAD_DIM, device="cuda"),
        "part_m": torch.empty(shape, device="cuda"),
        "part_l": torch.empty(shape, device="cuda"),
    }
    default = do_bench(
        lambda: decode_attention(q, cache, table, lens, scale, out, splits, mid_o, mid_lse)
    )
    det = do_bench(
        lambda: batch_invariant_attention(
            q,
            cache,
            qsl,
            lens,
            table,
            scale,
            out,
            num_segments=segs,
            decode_rows=True,
            **(parts if segs else {}),
        )
    )
    return {"case": f"decode b{num_seqs} ctx{ctx}", "default_ms": default, "deterministic_ms": det}


def bench_prefill(length: int) -> dict:
    cache, table = paged(1, length)
    q = torch.randn(length, HEADS, HEAD_DIM, device="cuda").bfloat16()
    lens = torch.tensor([length], dtype=torch.int32, device="cuda")
    qsl = torch.tensor([0, length], dtype=torch.int32, device="cuda")
    out, scale = torch.empty_like(q), HEAD_DIM**-0.5
    default = do_bench(lambda: prefill_attention(q, cache, qsl, lens, table, scale, out))
    det = do_bench(lambda: batch_invariant_attention(q, cache, qsl, lens, table, scale, out))
    return {"case": f"prefill {length}", "default_ms": default, "deterministic_ms": det}


def bench_gemm(name: str, m: int) -> dict:
    k, n = GEMMS[name]
    x = torch.randn(m, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    default = do_bench(lambda: F.linear(x, w))
    det = do_bench(lambda: matmul(x, w))
    return {"case": f"gemm {name} M={m}", "default_ms": default, "deterministic_ms": det}


def main() -> None:
    cases = [lambda: bench_decode(256, 1000), lambda: bench_decode(4, 8000),
             lambda: bench_decode(1, 1000), lambda: bench_prefill(4096)]  # fmt: skip
    cases += [lambda n=n, m=m: bench_gemm(n, m) for m in (256, 8192) for n in GEMMS]
    for case in cases:
        result = case()
        result["ratio"] = round(result["deterministic_ms"] / result["default_ms"], 3)
        for key in ("default_ms", "deterministic_ms"):
            result[key] = round(result[key], 4)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
