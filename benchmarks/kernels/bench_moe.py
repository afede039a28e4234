"""The fused-MoE kernels (kernels/moe/) on one GPU at Qwen3-30B-A3B's expert shapes (128 experts,
top-8, hidden 2048, intermediate 768; --tp 2 halves the intermediate), bf16, at decode and
prefill step sizes: median time of the experts (the path configs.step_config picks: alignment,
two GEMMs, sum; at a few tokens two GEMVs; the router's top-k apart), TFLOP/s (6 * pairs * H *
I flops), bandwidth (the touched experts' weights once, plus the activations), the launches
from the profiler, and beside them cuBLAS per expert (the pairs' indices prepared outside the
timing: the loop's floor) and, with --vllm, vLLM's fused_experts from the same process. --tune
sweeps tiles per step size and prints a TABLE entry for kernels/moe/configs.py. --fp8:
block-FP8 experts (e4m3, 128 x 128 scales, activations per token-group of 128) beside the bf16
experts of the same step, and with --vllm vLLM's fused_experts with its block-FP8 quant config.
The small-step GEMVs against the grouped GEMMs under CUDA graphs: bench_moe_decode.py.

Prints one JSON line per case. Usage:
  python -m benchmarks.kernels.bench_moe [--tokens 1,8,64,512,4096,16384] [--tp 2] [--vllm] [--tune]
                                          [--fp8]
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import defaultdict

import torch
import torch.nn.functional as F
import triton
from torch.profiler import ProfilerActivity, profile

from minivllm.kernels.moe.configs import GemmTile, MoeTileConfig, moe_config, step_config
from minivllm.kernels.moe.fused_moe import fused_moe
from minivllm.kernels.moe.router import topk_softmax
from minivllm.layers.moe_router import route

E, H, INTER, TOP_K = 128, 2048, 768, 8


def bench_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def per_kernel_ms(fn, runs: int = 10) -> dict[str, float]:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:60]] += event.device_time / 1e3 / runs
    return {name: round(ms, 4) for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])}


def make_case(num_tokens: int, inter: int, seed: int = 0):
    g = torch.Generator("cuda").manual_seed(seed)
    dtype = torch.bfloat16
    x = torch.randn(num_tokens, H, device="cuda", generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * inter, H, device="cuda", generator=g) * H**-0.5).to(dtype)
    w2 = (torch.randn(E, H, inter, device="cuda", generator=g) * inter**-0.5).to(dtype)
    topk_weights, topk_ids = route(torch.randn(num_tokens, E, device="cuda", generator=g),
                                   TOP_K, True)  # fmt: skip
    return x, w13, w2, topk_weights, topk_ids


def cublas_per_expert(x, w13, w2, topk_weights, topk_ids):
    """A closure running each used expert's two GEMMs on its gathered tokens (cuBLAS), the
    per-expert indices computed beforehand (no host sync inside the timing)."""
    inter = w2.shape[2]
    flat = topk_ids.reshape(-1).long()
    groups = [(e, (flat == e).nonzero().squeeze(1)) for e in range(w13.shape[0])]
    groups = [(e, pairs, pairs // TOP_K) for e, pairs in groups if pairs.numel()]
    weights = topk_weights.reshape(-1, 1)

    def run() -> torch.Tensor:
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        for e, pairs, tokens in groups:
            h = F.linear(x[tokens], w13[e])
            y = F.linear(F.silu(h[:, :inter]) * h[:, inter:], w2[e])
            out.index_add_(0, tokens, y.float() * weights[pairs])
        return out.to(x.dtype)

    return run


def vllm_experts():
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
    except Exception as e:  # noqa: BLE001 - any import failure means: not comparable here
        return None, f"{type(e).__name__}: {e}"
    return fused_experts, None


def figures(num_tokens: int, inter: int, topk_ids: torch.Tensor, ms: float) -> dict:
    pairs = num_tokens * TOP_K
    experts_used = int(torch.unique(topk_ids).numel())
    flops = 6 * pairs * H * inter
    bytes_moved = experts_used * 3 * H * inter * 2 + num_tokens * H * 2 * 2 + pairs * inter * 2 * 2
    return {
        "tflops": round(flops / ms / 1e9, 2),
        "gb_per_s": round(bytes_moved / ms / 1e6, 1),
        "experts_used": experts_used,
    }


def case(num_tokens: int, inter: int, with_vllm: bool) -> dict:
    x, w13, w2, topk_weights, topk_ids = make_case(num_tokens, inter)
    ours = lambda: fused_moe(x, w13, w2, topk_weights, topk_ids)  # noqa: E731
    config = step_config(x.dtype, (E, H, inter, TOP_K), num_tokens)
    ms = bench_ms(ours)
    logits = torch.randn(num_tokens, E, device="cuda", dtype=x.dtype)
    router_ms = bench_ms(lambda: topk_softmax(logits, TOP_K, True))
    loop = cublas_per_expert(x, w13, w2, topk_weights, topk_ids)
    loop_ms = bench_ms(loop)
    result = {
        "case": "fused_moe", "tokens": num_tokens, "experts": E, "top_k": TOP_K, "hidden": H,
        "inter": inter, "dtype": "bfloat16", "block_m": getattr(config, "block_m", "gemv"),
        "ms": round(ms, 4),
        **figures(num_tokens, inter, topk_ids, ms), "kernels_ms": per_kernel_ms(ours),
        "router_ms": round(router_ms, 4),
        "cublas_per_expert_ms": round(loop_ms, 4), "speedup_vs_cublas_loop": round(loop_ms / ms, 2),
        "max_abs_diff_vs_loop": round((ours().float() - loop().float()).abs().max().item(), 5),
    }  # fmt: skip
    if with_vllm:
        fused_experts, error = vllm_experts()
        if fused_experts is None:
            result["vllm"] = error
        else:
            theirs = lambda: fused_experts(x, w13, w2, topk_weights, topk_ids)  # noqa: E731
            vllm_ms = bench_ms(theirs)
            result["vllm_ms"] = round(vllm_ms, 4)
            result["speedup_vs_vllm"] = round(vllm_ms / ms, 3)
            diff = (ours().float() - theirs().float()).abs().max().item()
            result["max_abs_diff_vs_vllm"] = round(diff, 5)
    return result


def expert_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] bf16 -> (e4m3 [E, N, K], float32 scales [E, N / 128, K / 128])."""
    from minivllm.layers.quantization.fp8_math import quantize_weight_blocks

    parts = [quantize_weight_blocks(w[e]) for e in range(w.shape[0])]
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])


def vllm_fp8(x, w13q, w13s, w2q, w2s, topk_weights, topk_ids):
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
        from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

        config = fp8_w8a8_moe_quant_config(w13s, w2s, block_shape=[128, 128])
    except Exception as e:  # noqa: BLE001 - any import failure means: not comparable here
        return None, f"{type(e).__name__}: {e}"
    return (lambda: fused_experts(x, w13q, w2q, topk_weights, topk_ids, quant_config=config)), None


def fp8_case(num_tokens: int, inter: int, with_vllm: bool) -> dict:
    """Block-FP8 experts against the bf16 experts of the same weights and step."""
    x, w13, w2, topk_weights, topk_ids = make_case(num_tokens, inter)
    (w13q, w13s), (w2q, w2s) = expert_blocks(w13), expert_blocks(w2)
    ours = lambda: fused_moe(x, w13q, w2q, topk_weights, topk_ids, None, w13s, w2s)  # noqa: E731
    ms = bench_ms(ours)
    bf16_ms = bench_ms(lambda: fused_moe(x, w13, w2, topk_weights, topk_ids))
    result = {
        "case": "fused_moe_fp8", "tokens": num_tokens, "experts": E, "top_k": TOP_K, "hidden": H,
        "inter": inter, "ms": round(ms, 4), "bf16_ms": round(bf16_ms, 4),
        "speedup_vs_bf16": round(bf16_ms / ms, 3), "kernels_ms": per_kernel_ms(ours),
        "max_abs_diff_vs_bf16": round((ours().float() - fused_moe(
            x, w13, w2, topk_weights, topk_ids).float()).abs().max().item(), 5),
    }  # fmt: skip
    if with_vllm:
        theirs, error = vllm_fp8(x, w13q, w13s, w2q, w2s, topk_weights, topk_ids)
        if theirs is None:
            result["vllm"] = error
        else:
            vllm_ms = bench_ms(theirs)
            result["vllm_ms"] = round(vllm_ms, 4)
            result["speedup_vs_vllm"] = round(vllm_ms / ms, 3)
            diff = (ours().float() - theirs().float()).abs().max().item()
            result["max_abs_diff_vs_vllm"] = round(diff, 5)
    return result


def tune(num_tokens: int, inter: int, block_k: int) -> dict:
    """The fastest tiles at this step size, BLOCK_K fixed (one per shape: batch invariance)."""
    x, w13, w2, topk_weights, topk_ids = make_case(num_tokens, inter)
    rule, best = moe_config(x.dtype, (E, H, inter, TOP_K), num_tokens), None
    for block_m, n_up, n_down, warps, stages in itertools.product(
        (16, 32, 64, 128), (32, 64, 128), (64, 128, 256), (4, 8), (3, 4)
    ):
        up = GemmTile(n_up, block_k, warps, stages)
        config = MoeTileConfig(block_m, up, GemmTile(n_down, block_k, warps, stages))
        try:
            ms = bench_ms(lambda c=config: fused_moe(x, w13, w2, topk_weights, topk_ids, c))
        except Exception:  # noqa: BLE001 - out of shared memory: not a candidate
            continue
        if best is None or ms < best[0]:
            best = (ms, config)
    ms, config = best
    return {
        "case": "tune", "tokens": num_tokens, "inter": inter, "ms": round(ms, 4),
        "rule_ms": round(bench_ms(lambda: fused_moe(x, w13, w2, topk_weights, topk_ids, rule)), 4),
        "config": repr(config),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,8,32,64,256,1024,4096,16384")
    parser.add_argument("--tp", type=int, default=1, help="intermediate split over this many ranks")
    parser.add_argument("--vllm", action="store_true", help="time vLLM's fused_experts too")
    parser.add_argument("--tune", action="store_true", help="sweep tiles instead")
    parser.add_argument("--block-k", type=int, default=64, help="--tune's fixed BLOCK_K")
    parser.add_argument("--fp8", action="store_true", help="block-FP8 experts beside bf16")
    args = parser.parse_args()
    inter = INTER // args.tp
    for num_tokens in (int(t) for t in args.tokens.split(",")):
        if args.fp8:
            print(json.dumps(fp8_case(num_tokens, inter, args.vllm)), flush=True)
        elif args.tune:
            print(json.dumps(tune(num_tokens, inter, args.block_k)), flush=True)
        else:
            print(json.dumps(case(num_tokens, inter, args.vllm)), flush=True)


if __name__ == "__main__":
    main()
