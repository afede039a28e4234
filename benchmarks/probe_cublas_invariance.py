"""Is cuBLAS already M-invariant for some GEMM shapes? For each linear layer of a model shape,
compares each of the first rows of x @ w.T computed in a batch of M rows with the same row
computed alone (M = 1), bitwise, over a ladder of M; and times cuBLAS against the
batch-invariant Triton GEMM of deterministic mode (kernels/matmul.py). One JSON line per
layer: the Ms whose rows differ from M = 1 (for cuBLAS and, as a check of the probe, for the
Triton GEMM, which must be empty), and both GEMMs' times at a few Ms.

    python benchmarks/probe_cublas_invariance.py [--model qwen3-0.6b]
    CUBLAS_WORKSPACE_CONFIG=:0:0 python benchmarks/probe_cublas_invariance.py   # no workspace

The environment is read by cuBLAS when it starts: set it outside the process.
"""

from __future__ import annotations

import argparse
import json
import os
from importlib import resources

import torch
import torch.nn.functional as F

LADDER = [1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
LADDER += [768, 1024, 1536, 2048, 3072, 4096, 8192]
TIMED = [1, 8, 64, 256, 1024, 4096, 8192]
NUM_ROWS_CHECKED = 4


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of each GEMM of one decoder layer and the LM head."""
    with resources.as_file(resources.files("minivllm") / "configs" / f"{model}.json") as path:
        cfg = json.loads(path.read_text())
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim", hidden // heads)
    kv = cfg["num_key_value_heads"]
    return {
        "qkv": ((heads + 2 * kv) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate_up": (2 * cfg["intermediate_size"], hidden),
        "down": (hidden, cfg["intermediate_size"]),
        "lm_head": (cfg["vocab_size"], hidden),
    }


def time_ms(gemm, x: torch.Tensor, w: torch.Tensor, iters: int = 20) -> float:
    for _ in range(3):
        gemm(x, w)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        gemm(x, w)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def differing_ms(gemm, x: torch.Tensor, w: torch.Tensor) -> list[int]:
    """The Ms of LADDER at which one of the first rows differs from that row alone."""
    alone = torch.cat([gemm(x[i : i + 1], w) for i in range(NUM_ROWS_CHECKED)])
    out = []
    for m in LADDER:
        rows = gemm(x[:m], w)[:NUM_ROWS_CHECKED]
        if not torch.equal(rows, alone[: rows.shape[0]]):
            out.append(m)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    from minivllm.kernels.matmul import matmul

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    for name, (n, k) in layer_shapes(args.model).items():
        x = torch.randn(max(LADDER), k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        result = {
            "model": args.model,
            "layer": name,
            "N": n,
            "K": k,
            "dtype": args.dtype,
            "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "default"),
            "cublas_differs_at": differing_ms(F.linear, x, w),
            "triton_differs_at": differing_ms(matmul, x, w),
            "cublas_ms": {},
            "triton_ms": {},
        }
        for m in TIMED:
            result["cublas_ms"][m] = round(time_ms(F.linear, x[:m], w), 4)
            result["triton_ms"][m] = round(time_ms(matmul, x[:m], w), 4)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
