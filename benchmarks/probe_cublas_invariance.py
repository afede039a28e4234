"""Where does cuBLAS give the batch-invariant GEMM's bits? For each linear layer of a model shape
(and its LM head), the check deterministic mode runs when it builds a model
(layers/invariant_gemm.py: cuBLAS against the Triton GEMM of kernels/matmul.py at every rung of
the row ladder, all rows, bitwise, random inputs): the rungs where they differ and those of
them that run cuBLAS padded to a near rung that matched; and the times
of cuBLAS, of deterministic mode's GEMM (InvariantGemm: cuBLAS padded to a rung where it
matched, Triton elsewhere) and of the Triton GEMM. One JSON line per layer.

    python benchmarks/probe_cublas_invariance.py [--model qwen3-0.6b|qwen3-8b|smollm2-135m]
        [--max-rows 16384] [--bias] [--no-times]
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

TIMED = [1, 8, 64, 200, 256, 1000, 1024, 4096, 5000, 8192]
# SmolLM2-135M (the demo model): no config file in the package.
SMOLLM2 = {
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
}


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of each GEMM of one decoder layer and the LM head."""
    if model == "smollm2-135m":
        cfg = SMOLLM2
    else:
        with resources.as_file(resources.files("minivllm") / "configs" / f"{model}.json") as p:
            cfg = json.loads(p.read_text())
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-rows", type=int, default=16384)
    parser.add_argument("--bias", action="store_true", help="with a bias (Qwen2's q/k/v)")
    parser.add_argument("--no-times", action="store_true")
    args = parser.parse_args()
    from minivllm.kernels.matmul import matmul
    from minivllm.layers.invariant_gemm import InvariantGemm

    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda")
    gemm = InvariantGemm(matmul, args.max_rows)
    for name, (n, k) in layer_shapes(args.model).items():
        key = (n, k, dtype, args.bias)
        gemm.verify([key], device)
        checked = [r for r in gemm.ladder if r <= gemm.top_rung[key]]
        result = {
            "model": args.model,
            "layer": name,
            "N": n,
            "K": k,
            "dtype": args.dtype,
            "bias": args.bias,
            "torch": torch.__version__,
            "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "default"),
            "rungs_checked": len(checked),
            "top_rung": checked[-1],
            "cublas_ne_triton": [r for r in checked if r not in gemm.matched_rungs(key)],
            # rungs that missed but run cuBLAS padded to a near one that matched
            "padded_to": {r: m for r, m in gemm.run_at[key].items() if r != m},
        }
        if not args.no_times:
            x = torch.randn(max(TIMED), k, device=device, dtype=dtype)
            w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
            for label, fn in (("cublas", F.linear), ("deterministic", gemm), ("triton", matmul)):
                result[f"{label}_ms"] = {m: round(time_ms(fn, x[:m], w), 4) for m in TIMED}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
