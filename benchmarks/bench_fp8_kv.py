"""FP8 KV cache on one GPU: decode attention over a bf16 and an fp8 (e4m3) cache, its effective
bandwidth against the bytes it actually reads, next to a plain device copy of as many bytes.

Prints one JSON line per case. Usage: python benchmarks/bench_fp8_kv.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import traceback

import torch
import triton

from minivllm.kernels.decode_attention import MAX_SPLITS, choose_num_splits, decode_attention
from minivllm.kernels.kv_store import store_kv
from minivllm.kernels.prefill_attention import prefill_attention

BLOCK_SIZE = 16
FP8 = torch.float8_e4m3fn


def bench(fn, quick: bool) -> float:
    """Median milliseconds (L2 flushed between runs by do_bench)."""
    return triton.testing.do_bench(
        fn, warmup=10 if quick else 25, rep=30 if quick else 200, return_mode="median"
    )


def paged_cache(batch: int, ctx: int, num_kv_heads: int, head_dim: int, kv_dtype):
    """Every context on its own blocks in a random order (a churned cache); values ~N(0, 1)."""
    blocks_per_seq = triton.cdiv(ctx, BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, device="cuda")
    cache = cache.to(kv_dtype)  # e4m3 at scale 1.0: N(0, 1) values lie well inside +-448
    perm = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)
    block_tables = perm.view(batch, blocks_per_seq).contiguous()
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return cache, block_tables, seq_lens


def copy_tb_per_s(num_bytes: int, quick: bool) -> float:
    """A device copy of num_bytes: what reading (and writing) that many bytes costs."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), quick)
    return 2 * num_bytes / ms / 1e9  # read + write


def decode_case(batch, ctx, num_heads, num_kv_heads, head_dim, kv, quick, config=None) -> dict:
    kv_dtype = FP8 if kv == "fp8" else torch.bfloat16
    cache, block_tables, seq_lens = paged_cache(batch, ctx, num_kv_heads, head_dim, kv_dtype)
    q = torch.randn(batch, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    mid_o = torch.empty(batch, num_heads, MAX_SPLITS, head_dim, device="cuda")
    mid_lse = torch.empty(batch, num_heads, MAX_SPLITS, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = choose_num_splits(batch, num_kv_heads, ctx, sms)
    scale = head_dim**-0.5
    ms = bench(
        lambda: decode_attention(
            q, cache, block_tables, seq_lens, scale, out, splits, mid_o, mid_lse, config=config
        ),  # fmt: skip
        quick,
    )
    # What the kernel reads: every K/V element once (in the cache's dtype), q, block tables.
    kv_bytes = 2 * batch * ctx * num_kv_heads * head_dim * cache.element_size()
    bytes_read = kv_bytes + q.numel() * q.element_size() + block_tables.numel() * 4
    # Error against float32 attention over the same (dequantized) cache values.
    k = cache[0].float()[block_tables.long()].flatten(1, 2)[:, :ctx]  # [B, ctx, Hkv, D]
    v = cache[1].float()[block_tables.long()].flatten(1, 2)[:, :ctx]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float()[:, :, None], k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=True
    )[:, :, 0]
    return {
        "kernel": "decode_attention",
        "kv_cache_dtype": kv,
        "batch": batch,
        "ctx": ctx,
        "heads": f"{num_heads}/{num_kv_heads}",
        "head_dim": head_dim,
        "num_splits": splits,
        "config": config,
        "ms": round(ms, 4),
        "kv_bytes": kv_bytes,
        "bytes_read": bytes_read,
        "tb_per_s": round(bytes_read / ms / 1e9, 3),
        "copy_tb_per_s": round(copy_tb_per_s(bytes_read, quick), 3),
        "max_abs_err_vs_fp32": (out.float() - ref).abs().max().item(),
    }


def prefill_case(seq_len, num_heads, num_kv_heads, head_dim, kv, quick) -> dict:
    """Prefill attention of one prompt (what fp8 conversion costs in the compute-bound path)."""
    kv_dtype = FP8 if kv == "fp8" else torch.bfloat16
    cache, block_tables, seq_lens = paged_cache(1, seq_len, num_kv_heads, head_dim, kv_dtype)
    q = torch.randn(seq_len, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    qsl = torch.tensor([0, seq_len], dtype=torch.int32, device="cuda")
    scale = head_dim**-0.5
    ms = bench(lambda: prefill_attention(q, cache, qsl, seq_lens, block_tables, scale, out), quick)
    flops = 4 * seq_len * seq_len * num_heads * head_dim / 2  # causal
    return {"kernel": "prefill_attention", "kv_cache_dtype": kv, "seq_len": seq_len,
            "heads": f"{num_heads}/{num_kv_heads}", "head_dim": head_dim, "ms": round(ms, 4),
            "tflop_per_s": round(flops / ms / 1e9, 1)}  # fmt: skip


def store_case(num_tokens, num_kv_heads, head_dim, kv, quick) -> dict:
    """The KV store (with quantization for fp8) of one step's new tokens."""
    kv_dtype = FP8 if kv == "fp8" else torch.bfloat16
    k = torch.randn(num_tokens, num_kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    blocks = triton.cdiv(num_tokens, BLOCK_SIZE) * 2
    cache = torch.zeros(2, blocks, BLOCK_SIZE, num_kv_heads, head_dim, device="cuda",
                        dtype=kv_dtype)  # fmt: skip
    slots = torch.randperm(blocks * BLOCK_SIZE, device="cuda")[:num_tokens]
    ms = bench(lambda: store_kv(k, v, cache, slots), quick)
    moved = 2 * k.numel() * (k.element_size() + cache.element_size())
    return {"kernel": "store_kv", "kv_cache_dtype": kv, "num_tokens": num_tokens,
            "ms": round(ms, 4), "tb_per_s": round(moved / ms / 1e9, 3)}  # fmt: skip


def cases(quick: bool):
    for kv in ("auto", "fp8"):
        yield (
            f"decode_b256_ctx1000_{kv}",
            lambda kv=kv: decode_case(256, 1000, 16, 8, 128, kv, quick),
        )
    if quick:
        return
    for kv in ("auto", "fp8"):
        yield f"decode_b4_ctx8000_{kv}", lambda kv=kv: decode_case(4, 8000, 16, 8, 128, kv, quick)
        yield f"decode_b64_ctx4000_{kv}", lambda kv=kv: decode_case(64, 4000, 16, 8, 128, kv, quick)
        yield f"prefill_4096_{kv}", lambda kv=kv: prefill_case(4096, 16, 8, 128, kv, quick)
        yield f"store_8192_{kv}", lambda kv=kv: store_case(8192, 8, 128, kv, quick)
    # fp8 tiles take half the shared memory: do longer tiles or more stages pay?
    for cfg in ((64, 4, 3), (128, 4, 3), (128, 8, 3), (64, 4, 4), (128, 4, 4), (256, 8, 3)):
        yield (
            f"sweep_decode_b256_ctx1000_fp8_{cfg}",
            lambda c=cfg: decode_case(256, 1000, 16, 8, 128, "fp8", quick, c),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the b256 ctx1000 pair only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fp8_kv.py needs a CUDA GPU")
    torch.manual_seed(0)
    meta = {"device": torch.cuda.get_device_name(0), "triton": triton.__version__}
    for name, run in cases(args.quick):
        try:
            print(json.dumps({"case": name, **run(), **meta}), flush=True)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            print(json.dumps({"case": name, "error": repr(e)}), flush=True)
            traceback.print_exc()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
