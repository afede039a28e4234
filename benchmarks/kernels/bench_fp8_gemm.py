"""The block-scaled FP8 GEMM (kernels/fp8_gemm.py, activations quantized on the fly) against our
bf16 GEMMs (cuBLAS through F.linear, the Triton GEMM of kernels/matmul.py) and cuBLAS's FP8
(torch._scaled_mm, row-wise scales: the FP8 rate bound of /work/shared/PERF.md) at Qwen3-8B's
linear weights and a dense 27B's MLP weights (hidden 5120, intermediate 17408), for M = 1, 16,
256 and 4096 rows. Times are medians of triton.testing.do_bench (L2 flushed between runs).

Prints one JSON line. Usage: python -m benchmarks.kernels.bench_fp8_gemm [--quick] [--vllm] [--tune]
  --vllm: also vLLM's per_token_group_quant_fp8 + w8a8_block_fp8_matmul (if vllm imports)
  --tune: sweeps tile configs per shape and M; the line's "table" pastes into
          kernels/fp8_gemm_configs.py's TABLE
  --deterministic: our FP8 GEMM with deterministic mode's one config per shape
"""

from __future__ import annotations

import argparse
import itertools
import json

from benchmarks.common import require_cuda

SHAPES = {
    "8b.qkv_proj": (6144, 4096),
    "8b.o_proj": (4096, 4096),
    "8b.gate_up_proj": (24576, 4096),
    "8b.down_proj": (4096, 12288),
    "27b.gate_up_proj": (34816, 5120),
    "27b.down_proj": (5120, 17408),
}
ROWS = (1, 16, 256, 4096)
TUNE_ROWS = (1, 16, 64, 256, 4096)  # the bucket bounds of the tuned table


def bench_ms(fn, quick: bool) -> float:
    import triton

    return triton.testing.do_bench(
        fn, warmup=10 if quick else 25, rep=40 if quick else 200, return_mode="median"
    )


def operands(n: int, k: int, m: int):
    import torch

    from minivllm.layers.quantization.fp8_math import quantize_weight_blocks

    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", generator=gen) / k**0.5
    wq, ws = quantize_weight_blocks(w)
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    return x, w.bfloat16(), wq, ws


def scaled_mm_fn(x, w_bf16):
    """cuBLAS FP8 with row-wise scales (per token, per output channel), or None where this
    torch or GPU has no such _scaled_mm."""
    import torch

    xs = x.float().abs().amax(1, keepdim=True).clamp_min(1e-10) / 448.0
    wsc = w_bf16.float().abs().amax(1, keepdim=True).clamp_min(1e-10) / 448.0
    xq = (x.float() / xs).to(torch.float8_e4m3fn)
    wq = (w_bf16.float() / wsc).to(torch.float8_e4m3fn)

    def run():
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=wsc.t(), out_dtype=torch.bfloat16)

    try:
        run()
    except (RuntimeError, TypeError):
        return None
    return run


def vllm_fn(x, wq, ws):
    """vLLM's Triton block-FP8 path: its token-group quantization, then its block-scaled GEMM
    (`w8a8_triton_block_scaled_mm` in 0.26, `w8a8_block_fp8_matmul` before)."""
    try:
        from vllm.model_executor.layers.quantization.utils import fp8_utils
    except Exception:  # noqa: BLE001 - any import failure: no vLLM column
        return None
    gemm = getattr(fp8_utils, "w8a8_triton_block_scaled_mm", None) or getattr(
        fp8_utils, "w8a8_block_fp8_matmul", None
    )
    if gemm is None:
        return None

    def run():
        xq, xs = fp8_utils.per_token_group_quant_fp8(x, 128)
        return gemm(xq, wq, xs, ws, [128, 128], x.dtype)

    return run


def case(name: str, n: int, k: int, m: int, args) -> dict:
    import torch.nn.functional as F

    from minivllm.kernels.fp8_gemm import block_fp8_linear
    from minivllm.kernels.fp8_gemm_configs import fp8_gemm_config
    from minivllm.kernels.matmul import matmul

    x, w, wq, ws = operands(n, k, m)
    fp8 = bench_ms(
        lambda: block_fp8_linear(x, wq, ws, deterministic=args.deterministic), args.quick
    )
    row = {
        "shape": name, "n": n, "k": k, "m": m,
        "config": fp8_gemm_config(n, k, m, args.deterministic),
        "fp8_ms": round(fp8, 4),
        "bf16_cublas_ms": round(bench_ms(lambda: F.linear(x, w), args.quick), 4),
        "bf16_triton_ms": round(bench_ms(lambda: matmul(x, w), args.quick), 4),
    }  # fmt: skip
    scaled = scaled_mm_fn(x, w)
    row["fp8_scaled_mm_ms"] = round(bench_ms(scaled, args.quick), 4) if scaled else None
    if args.vllm:
        run = vllm_fn(x, wq, ws)
        row["vllm_block_fp8_ms"] = round(bench_ms(run, args.quick), 4) if run else None
    flops, fp8_bytes = 2 * m * n * k, n * k + m * k * 2 + m * n * 2
    row["fp8_tflop_per_s"] = round(flops / fp8 / 1e9, 1)
    row["fp8_tb_per_s"] = round(fp8_bytes / fp8 / 1e9, 3)
    row["fp8_vs_bf16_cublas"] = round(row["bf16_cublas_ms"] / fp8, 3)
    return row


def candidates(m: int) -> list[tuple[int, int, int, int]]:
    block_ms = (16,) if m <= 16 else (16, 32, 64) if m <= 64 else (64, 128)
    return list(itertools.product(block_ms, (32, 64, 128), (4, 8), (3, 4, 5)))


def tune(n: int, k: int, quick: bool) -> list[list]:
    """((max_m, best config), ...) over TUNE_ROWS: the buckets of TABLE[(n, k)]."""
    from minivllm.kernels.fp8_gemm import block_fp8_linear

    buckets = []
    for i, m in enumerate(TUNE_ROWS):
        x, _, wq, ws = operands(n, k, m)

        def run(config, x=x, wq=wq, ws=ws):
            return block_fp8_linear(x, wq, ws, config=config)

        timed = []
        for config in candidates(m):
            try:
                timed.append((bench_ms(lambda c=config: run(c), quick), config))
            except Exception:  # noqa: BLE001 - a config that does not compile (shared memory)
                continue
        bound = m if i < len(TUNE_ROWS) - 1 else 1 << 62
        buckets.append([bound, list(min(timed)[1])])
    return buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    require_cuda("bench_fp8_gemm.py", "it times GPU kernels")
    import torch

    cases = [case(name, n, k, m, args) for name, (n, k) in SHAPES.items() for m in ROWS]
    line = {
        "bench": "fp8_gemm",
        "device": torch.cuda.get_device_name(),
        "deterministic": args.deterministic,
        "cases": cases,
    }
    if args.tune:
        line["table"] = {f"({n}, {k})": tune(n, k, args.quick) for n, k in SHAPES.values()}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
