"""FP8 KV cache on one GPU: decode attention over a bf16 and an fp8 (e4m3) cache, its effective
bandwidth against the bytes it actually reads, next to a plain device copy of as many bytes.

Prints one JSON line per case.
Usage: python -m benchmarks.kernels.bench_fp8_kv [--quick] [--variants]
--variants: decode kernel variants (inline-asm V conversion, tiles, stages) on the same cache
values, each checked against the default fp8 output; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Iterator

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


def reference(q, cache, block_tables, ctx: int, scale: float) -> torch.Tensor:
    """float32 attention over the same (dequantized) cache values: [B, H, D]."""
    k = cache[0].float()[block_tables.long()].flatten(1, 2)[:, :ctx]  # [B, ctx, Hkv, D]
    v = cache[1].float()[block_tables.long()].flatten(1, 2)[:, :ctx]
    return torch.nn.functional.scaled_dot_product_attention(
        q.float()[:, :, None], k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=True
    )[:, :, 0]


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
    ref = reference(q, cache, block_tables, ctx, scale)
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


# --variants: decode shapes (batch, ctx) at 16/8 heads, head_dim 128, and the tiles to try.
DECODE_SHAPES = ((256, 1000), (64, 4000), (4, 8000))
VARIANT_CONFIGS = tuple((bn, nw, ns) for bn in (64, 128) for nw in (4, 8) for ns in (3, 5))


def variants() -> Iterator[tuple[str, str, bool, tuple[int, int, int] | None]]:
    """(name, kv, v_cvt_asm, config). fp8_default first: every row is compared with it; each
    asm row has a plain-cast twin at the same config (its name without "asm_")."""
    yield "fp8_default", "fp8", False, None
    yield "bf16_default", "auto", False, None
    yield "fp8_asm_default", "fp8", True, None
    for bn, nw, ns in VARIANT_CONFIGS:
        yield f"fp8_bn{bn}_w{nw}_s{ns}", "fp8", False, (bn, nw, ns)
        yield f"fp8_asm_bn{bn}_w{nw}_s{ns}", "fp8", True, (bn, nw, ns)


def run_variant(args: tuple, splits: int, asm: bool, config, quick: bool) -> tuple[float, object]:
    """(median ms, the output of one clean call) of decode_attention over args."""
    q, cache, block_tables, seq_lens, scale = args
    out = torch.empty_like(q)
    mid_o = torch.empty(q.shape[0], q.shape[1], MAX_SPLITS, q.shape[2], device="cuda")
    mid_lse = torch.empty(mid_o.shape[:3], device="cuda")

    def call():
        decode_attention(q, cache, block_tables, seq_lens, scale, out, splits, mid_o, mid_lse,
                         config=config, v_cvt_asm=asm)  # fmt: skip

    call()
    result = out.clone()
    return bench(call, quick), result


def variant_rows(batch: int, ctx: int, quick: bool) -> Iterator[dict]:
    """One row per variant, then a summary row. Both caches hold the same numbers (e4m3 values
    are exact in bf16), so every output is compared with fp8_default's."""
    num_heads, num_kv_heads, head_dim = 16, 8, 128
    fp8_cache, block_tables, seq_lens = paged_cache(batch, ctx, num_kv_heads, head_dim, FP8)
    caches = {"fp8": fp8_cache, "auto": fp8_cache.to(torch.bfloat16)}
    q = torch.randn(batch, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    ref = reference(q, fp8_cache, block_tables, ctx, head_dim**-0.5)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = choose_num_splits(batch, num_kv_heads, ctx, sms)
    case = f"variants_decode_b{batch}_ctx{ctx}"
    outs, times, copy_rates, mismatches = {}, {}, {}, []
    for name, kv, asm, config in variants():
        row = {"case": case, "variant": name, "kv_cache_dtype": kv, "v_cvt_asm": asm,
               "config": config, "num_splits": splits}  # fmt: skip
        try:
            args = (q, caches[kv], block_tables, seq_lens, head_dim**-0.5)
            times[name], outs[name] = run_variant(args, splits, asm, config, quick)
        except Exception as e:  # noqa: BLE001 - one failing variant must not hide the others
            traceback.print_exc()
            yield {**row, "error": repr(e)}
            continue
        bytes_read = caches[kv].element_size() * 2 * batch * ctx * num_kv_heads * head_dim
        bytes_read += q.numel() * q.element_size() + block_tables.numel() * 4
        if bytes_read not in copy_rates:
            copy_rates[bytes_read] = round(copy_tb_per_s(bytes_read, quick), 3)
        row |= {"ms": round(times[name], 4), "bytes_read": bytes_read,
                "tb_per_s": round(bytes_read / times[name] / 1e9, 3),
                "copy_tb_per_s": copy_rates[bytes_read],
                **compare(name, kv, asm, outs, times, ref)}  # fmt: skip
        mismatches += [name] if row.get("check") == "MISMATCH" else []
        yield row
    yield summary_row(case, times, mismatches)


def compare(name: str, kv: str, asm: bool, outs: dict, times: dict, ref) -> dict:
    """Errors against fp32 and fp8_default. An fp8 output further than 2 bf16 ulps of the
    largest output from fp8_default's is a MISMATCH (a wrong asm element order is O(output));
    an asm row also says whether it is bit-equal to its plain-cast twin, and how much faster."""
    out = outs[name].float()
    row = {"max_abs_err_vs_fp32": (out - ref).abs().max().item()}
    if "fp8_default" not in outs:
        return row | {"check": "no fp8_default output to compare with"}
    base = outs["fp8_default"].float()
    row["max_abs_diff_vs_fp8_default"] = diff = (out - base).abs().max().item()
    twin = name.replace("asm_", "")
    if asm and twin in outs:
        row["bitwise_equal_to_twin"] = torch.equal(outs[name], outs[twin])
        row["speedup_vs_twin"] = round(times[twin] / times[name], 3)
    if kv == "fp8":
        row["check"] = "ok" if diff <= 2**-7 * base.abs().max().item() else "MISMATCH"
    return row


def summary_row(case: str, times: dict, mismatches: list) -> dict:
    """Speedups over bf16: the numbers that decide whether fp8 + asm becomes the default."""
    bf16 = times.get("bf16_default", float("nan"))
    fp8 = {n: t for n, t in times.items() if n.startswith("fp8_") and n not in mismatches}
    asm = {n: t for n, t in fp8.items() if "asm_" in n}
    row = {"case": f"{case}_summary", "bf16_ms": round(bf16, 4), "mismatches": mismatches,
           "fp8_default_speedup_vs_bf16": round(bf16 / fp8["fp8_default"], 3)
           if "fp8_default" in fp8 else None}  # fmt: skip
    for label, group in (("best_fp8", fp8), ("best_asm", asm)):
        best = min(group, key=group.get, default=None)
        row[label] = best
        row[f"{label}_speedup_vs_bf16"] = round(bf16 / group[best], 3) if best else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the b256 ctx1000 case only")
    parser.add_argument("--variants", action="store_true", help="decode kernel variants")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fp8_kv.py needs a CUDA GPU")
    torch.manual_seed(0)
    meta = {"device": torch.cuda.get_device_name(0), "triton": triton.__version__}
    if args.variants:
        main_variants(args.quick, meta)
        return
    for name, run in cases(args.quick):
        try:
            print(json.dumps({"case": name, **run(), **meta}), flush=True)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            print(json.dumps({"case": name, "error": repr(e)}), flush=True)
            traceback.print_exc()
        torch.cuda.empty_cache()


def main_variants(quick: bool, meta: dict) -> None:
    mismatches = []
    for batch, ctx in DECODE_SHAPES[:1] if quick else DECODE_SHAPES:
        for row in variant_rows(batch, ctx, quick):
            print(json.dumps({**row, **meta}), flush=True)
            case = row["case"].removesuffix("_summary")
            mismatches += [f"{case}:{m}" for m in row.get("mismatches", [])]
        torch.cuda.empty_cache()
    if mismatches:
        print(f"MISMATCH against the default fp8 output: {mismatches}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
