"""Deterministic mode on one GPU (<= 3 min): where its cost goes and which fixed tile configs are
fastest. GEMMs: every candidate config against cuBLAS for the Qwen3-0.6B / 8B (and TP=2) weight
shapes at M = 1..8192; a config joins a shape's M-bucket table only if the GPU gives every row
the same bits as the shape's reference config at M = 1, 7, 64, 256, 2048. Attention: decode and
prefill tile configs against the default kernels, decode tiles admitted only where a decode row
equals the same token's prefill row bit for bit. Prints one JSON line per winner, a breakdown
of the headline decode step, and a final line with the tables (also $OUT/det_gemm_table.json).

python benchmarks/tune_deterministic.py [--budget-s 170] [--smoke (CPU interpreter, tiny)]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from itertools import product
from multiprocessing import get_context

import torch
import torch.nn.functional as F
from tune_attention import (
    DECODE_STEPS,
    PREFILL_CHUNKS,
    attn_jobs_inputs,
    compile_attention,
    tune_attention,
)

from minivllm.kernels.matmul import matmul
from minivllm.kernels.matmul_configs import default_config

MS = (1, 16, 64, 128, 256, 512, 2048, 8192)
CHECK_MS = (1, 7, 64, 256, 2048)  # rows compared bitwise against the reference config
LM_HEAD_MAX_M = 512  # the LM head only sees sampled rows
MODELS = {  # name -> (hidden, q+kv heads * head_dim, intermediate, vocab)
    "qwen3-0.6b": (1024, 4096, 2048, 3072, 151936),
    "qwen3-8b": (4096, 6144, 4096, 12288, 151936),
}


def shapes(smoke: bool) -> list[tuple[str, int, int]]:
    """(name, N, K) in priority order: the headline model first, then 8B, then TP=2 halves."""
    if smoke:
        return [("smoke a", 64, 64), ("smoke b", 32, 128)]
    out = []
    for tp in (1, 2):
        for model, (h, qkv, o_in, inter, vocab) in MODELS.items():
            tag = f"{model} tp{tp}"
            out += [
                (f"{tag} qkv", qkv // tp, h),
                (f"{tag} o", h, o_in // tp),
                (f"{tag} gate_up", 2 * inter // tp, h),
                (f"{tag} down", h, inter // tp),
                (f"{tag} lm_head", vocab // tp, h),
            ]
    return out


def gemm_candidates(smoke: bool) -> list[tuple]:
    if smoke:
        return [(16, 16, 16, 4, 1), (32, 16, 16, 4, 1), (16, 32, 16, 4, 1), (16, 16, 32, 4, 1)]
    out = []
    for bm, bn, bk, warps, stages in product(
        (16, 32, 64, 128), (32, 64, 128, 256), (64, 128), (4, 8), (3, 4, 5)
    ):
        smem = (bm + bn) * bk * 2 * stages
        acc_regs = bm * bn // (32 * warps)
        if smem <= 200_000 and acc_regs <= 128 and not (bn == 32 and bm > 64):
            out.append((bm, bn, bk, warps, stages))
    return out


def fits(config: tuple, m: int, n: int) -> bool:
    """Candidates worth timing at this M: no BLOCK_M far above M, no tiny ones for large M."""
    bm, bn = config[0], config[1]
    pow2 = 1 << max(m - 1, 0).bit_length()
    return (
        bm <= max(16, pow2)
        and (m < 512 or bm >= 32)
        and (m < 2048 or bm >= 64)
        and (bn > 32 or n <= 4096)
    )


def _compile_gemms(configs: list[tuple], device: str) -> list[tuple]:
    """Worker: launches each config once on a tiny problem (fills Triton's disk cache; every
    shape here specializes alike: N, K and strides multiples of 16). Returns those that ran."""
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    x = torch.randn(1, 1024, device=device).to(dtype)
    w = torch.randn(1024, 1024, device=device).to(dtype)
    ok = []
    for config in configs:
        try:
            matmul(x, w, config=config)
            ok.append(config)
        except Exception:  # out of shared memory / registers: not a candidate
            pass
    if device == "cuda":
        torch.cuda.synchronize()
    return ok


def _results(jobs: list, inputs) -> set:
    """The configs the workers ran; a dead worker's inputs are kept (compiled here instead)."""
    out = set()
    for job, given in zip(jobs, inputs, strict=True):
        try:
            out.update(job.result())
        except Exception as err:
            print(json.dumps({"kind": "warning", "compile_worker": repr(err)}), flush=True)
            out.update(given)
    return out


class Timer:
    """GPU milliseconds per call of fns cycled (distinct weights, so not L2-resident): a GPU
    sleep first lets the CPU queue every call, so launch overhead is not measured."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def __call__(self, fns: list) -> float:
        if not self.cuda:
            fns[0]()
            start = time.perf_counter()
            fns[0]()
            return (time.perf_counter() - start) * 1e3
        # The warm-up call's time (launch gaps included: an overestimate) sets the repeats.
        guess_ms = self._run(fns, 1, sleep=False)
        reps = max(3, min(30, int(2.0 / max(guess_ms, 1e-3))))
        return self._run(fns, reps, sleep=True)

    def _run(self, fns: list, reps: int, sleep: bool) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if sleep:
            torch.cuda._sleep(reps * 80_000)  # ~40 us of CPU a call, at ~2 GHz
        start.record()
        for i in range(reps):
            fns[i % len(fns)]()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps


def _ref_config(n: int, block_k: int) -> tuple:
    bm, bn, _, warps, stages = default_config(torch.bfloat16, n)
    return bm, bn, block_k, warps, 3 if block_k == 128 else stages


def tune_shape(name: str, n: int, k: int, configs: list[tuple], timer: Timer, device: str):
    """Times cuBLAS, the current rule and every fitting config at each M; verifies winners
    bitwise; returns (per-M result dicts, buckets or None)."""
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    ms = [m for m in MS if not (name.endswith("lm_head") and m > LM_HEAD_MAX_M)]
    if device == "cpu":
        ms = [1, 16, 64]
    x = torch.randn(max(max(ms), 2048), k, device=device, generator=gen).to(dtype)
    copies = max(1, min(16, -(-256_000_000 // (n * k * 2))))
    ws = [
        (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(dtype)
        for _ in range(1 if device == "cpu" else copies)
    ]
    refs, verified = {}, {}
    check_ms = [m for m in CHECK_MS if device == "cuda" or m <= 64]

    def is_invariant(config: tuple) -> bool:
        if config not in verified:
            bk = config[2]
            if bk not in refs:
                ref = _ref_config(n, bk) if device == "cuda" else (16, 16, bk, 4, 1)
                refs[bk] = matmul(x[: check_ms[-1]], ws[0], config=ref)
            verified[config] = all(
                torch.equal(matmul(x[:m], ws[0], config=config), refs[bk][:m]) for m in check_ms
            )
        return verified[config]

    rows, best = [], {}  # best[(m, bk)] = (ms, config)
    for m in ms:
        xm = x[:m]
        cublas = timer([partial(F.linear, xm, w) for w in ws])
        current = default_config(dtype, n)
        times = {}
        for config in [current] + [c for c in configs if fits(c, m, n) and c != current]:
            try:
                times[config] = timer([partial(matmul, xm, w, config=config) for w in ws])
            except Exception as err:  # a config that does not run here is no candidate
                print(json.dumps({"kind": "warning", "config": config, "error": repr(err)}))
        for config in sorted(times, key=times.get)[:3]:  # one noisy sample should not win
            times[config] = min(
                times[config], timer([partial(matmul, xm, w, config=config) for w in ws])
            )
        for bk in sorted({c[2] for c in times}):
            for config in sorted((c for c in times if c[2] == bk), key=times.get)[:6]:
                if is_invariant(config):
                    best[(m, bk)] = (times[config], config)
                    break
        fastest = min(times, key=times.get)
        rows.append(
            {
                "shape": name,
                "n": n,
                "k": k,
                "m": m,
                "cublas_ms": cublas,
                "current": [current, times[current]],
                "fastest_any": [fastest, times[fastest]],
                "fastest_invariant": {bk: best.get((m, bk)) for bk in (64, 128)},
            }
        )
    bk = _choose_block_k(ms, best)
    for row in rows:  # the table's pick at this M (None: no BLOCK_K verified at every M)
        row["table"] = None if bk is None else best[(row["m"], bk)]
    return rows, None if bk is None else _buckets(ms, best, bk)


def _choose_block_k(ms: list[int], best: dict) -> int | None:
    """The BLOCK_K with a verified config at every M and the least summed time relative to
    the fastest verified config at each M."""
    scores = {}
    for bk in {bk for _, bk in best}:
        if all((m, bk) in best for m in ms):
            scores[bk] = sum(
                best[(m, bk)][0] / min(v[0] for (mm, _), v in best.items() if mm == m) for m in ms
            )
    return min(scores, key=scores.get) if scores else None


def _buckets(ms: list[int], best: dict, bk: int) -> list:
    """[[max_m, config], ...]: each M's fastest verified config, adjacent equal ones merged."""
    out = []
    for m in ms:
        config = list(best[(m, bk)][1])
        if out and out[-1][1] == config:
            out[-1][0] = m
        else:
            out.append([m, config])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=170.0)
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    parser.add_argument("--workers", type=int, default=min(14, (os.cpu_count() or 2) - 1))
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    device = "cpu" if args.smoke else "cuda"
    configs = gemm_candidates(args.smoke)
    # Compile every candidate in parallel processes first (spawned before this one touches
    # CUDA); Triton's disk cache hands the binaries to this process.
    pool = ProcessPoolExecutor(max(1, args.workers), mp_context=get_context("spawn"))
    gemm_jobs = [
        pool.submit(_compile_gemms, configs[i :: args.workers], device) for i in range(args.workers)
    ]
    attn_jobs = compile_attention(pool, args.workers, device, args.smoke)
    compiled = _results(gemm_jobs, [configs[i :: args.workers] for i in range(args.workers)])
    attn_ok = _results(attn_jobs, attn_jobs_inputs(args.workers, args.smoke))
    pool.shutdown()
    print(
        json.dumps(
            {
                "kind": "compiled",
                "gemm": len(compiled),
                "gemm_candidates": len(configs),
                "attention": len(attn_ok),
                "s": round(args.budget_s - deadline + time.monotonic(), 1),
            }
        ),
        flush=True,
    )
    timer = Timer(device)
    table, gemm_rows = {}, {}
    attention = tune_attention(timer, device, args.smoke, attn_ok)
    for name, n, k in shapes(args.smoke):
        if time.monotonic() > deadline:
            print(json.dumps({"kind": "skipped", "shape": name, "why": "budget"}), flush=True)
            continue
        rows, buckets = tune_shape(name, n, k, [c for c in configs if c in compiled], timer, device)
        for row in rows:
            gemm_rows[(name, row["m"])] = row
            print(json.dumps({"kind": "gemm"} | row), flush=True)
        if buckets is not None:
            table[f"{n}x{k}"] = buckets
    breakdown(gemm_rows, attention)
    final = {
        "kind": "table",
        "gemm": table,
        "attention": attention.get("table"),
        "python": "TABLE = {"
        + ", ".join(
            f"({key.replace('x', ', ')}): ({', '.join(f'({m}, {tuple(c)})' for m, c in b)},)"
            for key, b in table.items()
        )
        + "}",
    }
    print(json.dumps(final), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "det_gemm_table.json"), "w") as f:
            json.dump(final, f, indent=1)


def breakdown(rows: dict, attention: dict) -> None:
    """Qwen3-0.6B's headline steps: a decode step (batch 256: M = 256, the LM head on 256 rows)
    and a prefill chunk (M = 8192, the LM head on 16 rows), 28 layers of attention and four
    GEMMs, in ms for the default kernels, deterministic now, deterministic with the tables;
    and the headline's total in s from these parts alone (the rest of a step is the same in
    both modes)."""
    layers, tag = 28, "qwen3-0.6b tp1"
    steps = {}
    for step, m, lm_m, attn_key in (
        ("decode_b256", 256, 256, "decode"),
        ("prefill_8192", 8192, 16, "prefill"),
    ):
        parts = {}
        for op in ("qkv", "o", "gate_up", "down", "lm_head"):
            row = rows.get((f"{tag} {op}", lm_m if op == "lm_head" else m))
            if row is not None:
                count = 1 if op == "lm_head" else layers
                tuned = row["table"][0] if row["table"] else None
                parts[op] = [
                    count * row["cublas_ms"],
                    count * row["current"][1],
                    None if tuned is None else count * tuned,
                ]
        if attn_key in attention:
            a = attention[attn_key]
            parts["attention"] = [
                layers * a[key] for key in ("default_ms", "current_ms", "tuned_ms")
            ]
        totals = [sum(p[i] if p[i] is not None else p[1] for p in parts.values()) for i in range(3)]
        steps[step] = {"parts": parts, "totals": totals}
    line = {
        "kind": "breakdown",
        "columns": ["default", "deterministic_now", "deterministic_tuned"],
        "steps_ms": steps,
    }
    if len(steps["decode_b256"]["parts"]) == 6 and len(steps["prefill_8192"]["parts"]) == 6:
        line["headline_s_from_parts"] = [
            (
                DECODE_STEPS * steps["decode_b256"]["totals"][i]
                + PREFILL_CHUNKS * steps["prefill_8192"]["totals"][i]
            )
            / 1e3
            for i in range(3)
        ]
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
