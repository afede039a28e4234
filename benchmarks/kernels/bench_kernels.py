"""Kernel benchmarks on one GPU: paged decode and prefill attention, fused ops, sampling (the
draw, the filters' thresholds, the logprobs), the grammar bitmask, draft verification.

Prints one JSON line per case: time, achieved TB/s or TFLOP/s, and the ratio to a torch
reference timed in the same run (speedup = reference time / kernel time). A failing case
prints an error line and the run goes on.
Usage: python -m benchmarks.kernels.bench_kernels [--quick]
    [--only NAME_PREFIX: long_, tail_, mixed_...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import traceback

import torch
import torch.nn.functional as F
import triton

from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.kernels.activation import silu_and_mul
from minivllm.kernels.decode_attention import MAX_SPLITS, choose_num_splits, decode_attention
from minivllm.kernels.prefill_attention import prefill_attention, prefill_config
from minivllm.kernels.rmsnorm import rms_norm
from minivllm.layers.sampler import Sampler
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 16
DTYPE = torch.bfloat16


def bench(fn, quick: bool) -> float:
    """Median milliseconds (L2 flushed between runs by do_bench)."""
    return triton.testing.do_bench(
        fn, warmup=10 if quick else 25, rep=30 if quick else 200, return_mode="median"
    )


def paged_cache(seq_lens: list[int], num_kv_heads: int, head_dim: int):
    """A cache holding every context, its blocks a random permutation (a churned cache)."""
    counts = [triton.cdiv(n, BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(counts)
    cache = torch.randn(
        2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, device="cuda", dtype=DTYPE
    )
    perm = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(counts), dtype=torch.int32, device="cuda")
    start = 0
    for i, count in enumerate(counts):
        block_tables[i, :count] = perm[start : start + count]
        start += count
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return cache, block_tables, seq_lens_t


def gather_contiguous(cache, block_tables, seq_len: int, which: int) -> torch.Tensor:
    """[num_seqs, num_kv_heads, seq_len, head_dim]: one request's context laid out for SDPA."""
    blocks = cache[which][block_tables.long()]  # [B, nb, bs, Hkv, D]
    return blocks.flatten(1, 2)[:, :seq_len].transpose(1, 2).contiguous()


def decode_case(batch: int, ctx: int, num_heads: int, num_kv_heads: int, head_dim: int,
                num_splits: int | None, quick: bool, config=None) -> dict:  # fmt: skip
    cache, block_tables, seq_lens = paged_cache([ctx] * batch, num_kv_heads, head_dim)
    q = torch.randn(batch, num_heads, head_dim, device="cuda", dtype=DTYPE)
    out = torch.empty_like(q)
    mid_o = torch.empty(batch, num_heads, MAX_SPLITS, head_dim, device="cuda", dtype=torch.float32)
    mid_lse = torch.empty(batch, num_heads, MAX_SPLITS, device="cuda", dtype=torch.float32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = choose_num_splits(batch, num_kv_heads, ctx, sms) if num_splits is None else num_splits
    scale = head_dim**-0.5
    ms = bench(
        lambda: decode_attention(
            q, cache, block_tables, seq_lens, scale, out, splits, mid_o, mid_lse
        ),
        quick,
    )
    k = gather_contiguous(cache, block_tables, ctx, 0)
    v = gather_contiguous(cache, block_tables, ctx, 1)
    q4 = q[:, :, None, :]  # [B, H, 1, D]
    ref = F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)[:, :, 0]
    err = (out.float() - ref.float()).abs().max().item()
    ref_ms = bench(
        lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True), quick
    )
    kv_bytes = 2 * batch * ctx * num_kv_heads * head_dim * cache.element_size()
    return {
        "kernel": "decode_attention",
        "batch": batch,
        "ctx": ctx,
        "heads": f"{num_heads}/{num_kv_heads}",
        "head_dim": head_dim,
        "num_splits": splits,
        "ms": round(ms, 4),
        "tb_per_s": round(kv_bytes / ms / 1e9, 3),
        "ref": "sdpa_contiguous_gqa",
        "ref_ms": round(ref_ms, 4),
        "speedup_vs_ref": round(ref_ms / ms, 3),
        "max_abs_err": err,
    }


def mixed_decode_case(batch: int, ctx: int, quick: bool) -> dict:
    """Decode over contexts of mixed lengths (uniform in [ctx / 4, ctx], seeded), requests in
    row order and longest first (the engine's decode_order); 16/8 heads, head_dim 128."""
    gen = torch.Generator().manual_seed(batch + ctx)
    lens = torch.randint(ctx // 4, ctx + 1, (batch,), generator=gen).tolist()
    cache, block_tables, seq_lens = paged_cache(lens, 8, 128)
    q = torch.randn(batch, 16, 128, device="cuda", dtype=DTYPE)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = choose_num_splits(batch, 8, ctx, sms)
    mid_o = torch.empty(batch, 16, MAX_SPLITS, 128, device="cuda", dtype=torch.float32)
    mid_lse = torch.empty(batch, 16, MAX_SPLITS, device="cuda", dtype=torch.float32)
    longest_first = torch.argsort(seq_lens, descending=True, stable=True).to(torch.int32)
    kv_bytes = 2 * sum(lens) * 8 * 128 * cache.element_size()
    row = {"kernel": "decode_attention", "batch": batch, "ctx": f"{ctx // 4}-{ctx}",
           "num_splits": splits}  # fmt: skip
    outs = {}
    for name, order in (("row_order", None), ("longest_first", longest_first)):
        out = torch.empty_like(q)

        def call(out=out, order=order):
            decode_attention(q, cache, block_tables, seq_lens, 128**-0.5, out, splits, mid_o,
                             mid_lse, order=order)  # fmt: skip

        call()
        outs[name] = out.clone()
        ms = bench(call, quick)
        row[f"{name}_ms"] = round(ms, 4)
        row[f"{name}_tb_per_s"] = round(kv_bytes / ms / 1e9, 3)
    row["speedup"] = round(row["row_order_ms"] / row["longest_first_ms"], 3)
    row["outputs_equal"] = torch.equal(outs["row_order"], outs["longest_first"])
    return row


def prefill_case(
    seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, quick: bool, config=None
) -> dict:
    """config: (block_m, block_n, num_warps, num_stages) or None for the kernel's table."""
    group = num_heads // num_kv_heads
    config = config or prefill_config(head_dim, sum(seq_lens), group, num_kv_heads)
    block_m, block_n, num_warps, num_stages = config
    cache, block_tables, seq_lens_t = paged_cache(seq_lens, num_kv_heads, head_dim)
    num_tokens = sum(seq_lens)
    starts = [0]
    for n in seq_lens:
        starts.append(starts[-1] + n)
    qsl = torch.tensor(starts, dtype=torch.int32, device="cuda")
    q = torch.randn(num_tokens, num_heads, head_dim, device="cuda", dtype=DTYPE)
    out = torch.empty_like(q)
    scale = head_dim**-0.5
    ms = bench(
        lambda: prefill_attention(
            q,
            cache,
            qsl,
            seq_lens_t,
            block_tables,
            scale,
            out,
            0,
            block_m,
            block_n,
            num_warps,
            num_stages,
        ),
        quick,
    )
    # Reference: SDPA causal per request on contiguous [1, H, n, D] tensors (same lengths).
    qs, ks, vs = [], [], []
    for i, n in enumerate(seq_lens):
        qs.append(q[starts[i] : starts[i + 1]].transpose(0, 1)[None].contiguous())
        ks.append(gather_contiguous(cache, block_tables[i : i + 1], n, 0))
        vs.append(gather_contiguous(cache, block_tables[i : i + 1], n, 1))

    def ref_fn():
        return [
            F.scaled_dot_product_attention(a, b, c, is_causal=True, scale=scale, enable_gqa=True)
            for a, b, c in zip(qs, ks, vs, strict=True)
        ]

    err = max(
        (out[starts[i] : starts[i + 1]].transpose(0, 1)[None].float() - r.float())
        .abs()
        .max()
        .item()
        for i, r in enumerate(ref_fn())
    )
    ref_ms = bench(ref_fn, quick)
    flops = sum(2 * 2 * n * (n + 1) / 2 * head_dim * num_heads for n in seq_lens)  # causal qk + pv
    shape = seq_lens if len(seq_lens) <= 4 else f"{len(seq_lens)}x{seq_lens[0]}"
    return {
        "kernel": "prefill_attention",
        "seq_lens": shape,
        "heads": f"{num_heads}/{num_kv_heads}",
        "head_dim": head_dim,
        "config": config,
        "ms": round(ms, 4),
        "tflop_per_s": round(flops / ms / 1e9, 1),
        "ref": "sdpa_causal_contiguous",
        "ref_ms": round(ref_ms, 4),
        "speedup_vs_ref": round(ref_ms / ms, 3),
        "max_abs_err": err,
    }


def fused_ops_case(num_tokens: int, hidden: int, inter: int, quick: bool) -> dict:
    x = torch.randn(num_tokens, hidden, device="cuda", dtype=DTYPE)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda", dtype=DTYPE)
    gate_up = torch.randn(num_tokens, 2 * inter, device="cuda", dtype=DTYPE)

    def torch_norm():
        h = (x + res).float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DTYPE)

    norm_ms = bench(lambda: rms_norm(x, w, 1e-6, res), quick)
    norm_ref = bench(torch_norm, quick)
    silu_ms = bench(lambda: silu_and_mul(gate_up), quick)
    silu_ref = bench(lambda: F.silu(gate_up[:, :inter]) * gate_up[:, inter:], quick)
    return {
        "kernel": "fused_ops",
        "num_tokens": num_tokens,
        "hidden": hidden,
        "inter": inter,
        "rms_norm_residual_ms": round(norm_ms, 4),
        "rms_norm_tb_per_s": round(4 * x.numel() * 2 / norm_ms / 1e9, 3),
        "rms_norm_speedup_vs_torch": round(norm_ref / norm_ms, 3),
        "silu_and_mul_ms": round(silu_ms, 4),
        "silu_and_mul_tb_per_s": round(3 * num_tokens * inter * 2 / silu_ms / 1e9, 3),
        "silu_and_mul_speedup_vs_torch": round(silu_ref / silu_ms, 3),
    }


def sample_plain_case(batch: int, vocab_size: int, quick: bool) -> dict:
    """The fused plain sampler vs the torch path (same metadata marked non-plain), through
    Sampler as the runner calls it: temperature 0.8 rows, and all-greedy rows."""
    logits = torch.randn(batch, vocab_size, device="cuda", dtype=DTYPE) * 3
    sampler = Sampler(use_triton=True)  # the plain path is the fused kernel only when asked
    result = {"kernel": "sample_plain", "batch": batch, "vocab_size": vocab_size}
    for name, temperature in (("random", 0.8), ("greedy", 0.0)):
        state = SamplingState("cuda")
        req_ids = [f"r{i}" for i in range(batch)]
        for req_id in req_ids:
            params = SamplingParams(temperature=temperature)
            state.add_request(NewRequestData(req_id, [0], params))
        meta = state.build_metadata(req_ids)
        assert meta.is_plain
        torch_meta = dataclasses.replace(meta, is_plain=False)
        ms = bench(lambda m=meta: sampler(logits, m), quick)
        ref_ms = bench(lambda m=torch_meta: sampler(logits, m), quick)
        tokens = sampler(logits, meta).sampled_token_ids
        if temperature == 0.0:
            result["greedy_equal"] = bool(torch.equal(tokens, logits.argmax(-1)))
        else:
            # Fraction of rows that sampled their argmax: the same on both paths in expectation.
            ref_tokens = sampler(logits, torch_meta).sampled_token_ids
            argmax = logits.argmax(-1)
            result["argmax_rate"] = round((tokens == argmax).float().mean().item(), 3)
            result["ref_argmax_rate"] = round((ref_tokens == argmax).float().mean().item(), 3)
        result |= {
            f"{name}_ms": round(ms, 4),
            f"{name}_ref_ms": round(ref_ms, 4),
            f"{name}_speedup_vs_ref": round(ref_ms / ms, 3),
        }
    result["tb_per_s"] = round(
        logits.numel() * logits.element_size() / result["random_ms"] / 1e9, 3
    )
    return result


def filter_case(batch: int, vocab_size: int, quick: bool) -> dict:
    """Top-k 20 / top-p 0.8 thresholds (Qwen2.5's generation_config) of bf16 logits: the
    Triton passes against the torch path (torch.topk candidates) on the same float32 copy,
    thresholds equal."""
    from minivllm.kernels.filter_thresholds import filter_thresholds
    from minivllm.layers.sampling_filters import keep_thresholds

    logits = (torch.randn(batch, vocab_size, device="cuda") * 3).to(DTYPE)
    temperature = torch.full((batch,), 0.7, device="cuda")
    top_k = torch.full((batch,), 20, dtype=torch.int64, device="cuda")
    top_p = torch.full((batch,), 0.8, device="cuda")
    args = (temperature, top_k, top_p, None, 20)
    ms = bench(lambda: filter_thresholds(logits, *args), quick)
    ref_ms = bench(lambda: keep_thresholds(logits.float(), *args, True), quick)
    copy_ms = bench(lambda: logits.float(), quick)
    ref = keep_thresholds(logits.float(), *args, True)
    equal = torch.equal(filter_thresholds(logits, *args), ref)
    return {
        "kernel": "filter_thresholds", "batch": batch, "vocab_size": vocab_size, "equal": equal,
        "ms": round(ms, 4), "torch_topk_path_ms": round(ref_ms - copy_ms, 4),
        "float32_copy_ms": round(copy_ms, 4), "speedup": round((ref_ms - copy_ms) / ms, 2),
    }  # fmt: skip


def logprobs_case(rows: int, k: int, vocab_size: int, quick: bool) -> dict:
    """The logprobs of bf16 logits' sampled tokens and top k: the Triton passes
    (kernels/logprobs.py) against log_softmax + gather_logprobs (the torch path), values close,
    ranks equal."""
    from minivllm.kernels.logprobs import token_logprobs
    from minivllm.layers.sampler import gather_logprobs

    logits = (torch.randn(rows, vocab_size, device="cuda") * 3).to(DTYPE)
    tokens = torch.randint(0, vocab_size, (rows,), device="cuda")

    def reference():
        return gather_logprobs(torch.log_softmax(logits, dim=-1, dtype=torch.float32), tokens, k)

    ms = bench(lambda: token_logprobs(logits, tokens, k), quick)
    ref_ms = bench(reference, quick)
    (_, values, ranks), (_, ref_values, ref_ranks) = token_logprobs(logits, tokens, k), reference()
    return {
        "kernel": "token_logprobs", "rows": rows, "k": k, "vocab_size": vocab_size,
        "ranks_equal": torch.equal(ranks, ref_ranks),
        "max_abs_diff": float((values - ref_values).abs().max()), "ms": round(ms, 4),
        "torch_ms": round(ref_ms, 4), "speedup": round(ref_ms / ms, 2),
    }  # fmt: skip


def bitmask_case(rows: int, vocab_size: int, quick: bool) -> dict:
    """A grammar's bitmask applied to fp32 logits: the kernel against apply_bitmask's torch
    definition (unpack to bool, gather, select, scatter), on the device; equal results."""
    from minivllm.kernels.bitmask import mask_logits
    from minivllm.structured_output.bitmask import num_bitmask_words, unpack_bitmask

    logits = torch.randn(rows, vocab_size, device="cuda")
    words = num_bitmask_words(vocab_size)
    bitmask = torch.randint(-(2**31), 2**31, (rows, words), device="cuda").to(torch.int32)
    row_ids = torch.arange(rows, device="cuda")

    def reference(out: torch.Tensor) -> None:
        allowed = unpack_bitmask(bitmask, vocab_size)
        out[row_ids] = torch.where(allowed, out[row_ids], float("-inf"))

    got, expected = logits.clone(), logits.clone()
    mask_logits(got, bitmask, row_ids)
    reference(expected)
    ms = bench(lambda: mask_logits(got, bitmask, row_ids), quick)
    ref_ms = bench(lambda: reference(expected), quick)
    return {
        "kernel": "mask_logits",
        "rows": rows,
        "vocab_size": vocab_size,
        "equal": bool(torch.equal(got, expected)),
        "ms": round(ms, 4),
        "ref_ms": round(ref_ms, 4),
        "speedup_vs_ref": round(ref_ms / ms, 3),
    }


def verify_case(rows: int, drafts: int, quick: bool) -> dict:
    """Exact verification: the kernel against verify_exact's torch definition (the same
    launch sequence the CPU path runs, here on the device); equal results."""
    from minivllm.kernels.verify import verify_exact_fused
    from minivllm.spec_decode import verify as verify_module

    num_drafts = torch.full((rows,), drafts, device="cuda")
    draft_ids = torch.randint(0, 4, (rows, drafts), device="cuda")
    target = torch.randint(0, 4, (rows * (drafts + 1),), device="cuda")

    def reference():
        k = draft_ids.shape[1]
        position = verify_module._position_targets(target, num_drafts, k)
        match = draft_ids == position[:, :k]
        return verify_module._keep_leading(draft_ids, num_drafts, position, match)

    first = verify_module.first_rows(num_drafts)
    got, expected = verify_exact_fused(target, draft_ids, num_drafts, first), reference()
    ms = bench(lambda: verify_exact_fused(target, draft_ids, num_drafts, first), quick)
    ref_ms = bench(reference, quick)
    return {
        "kernel": "verify_exact",
        "rows": rows,
        "drafts": drafts,
        "equal": bool(
            torch.equal(got[0], expected.num_accepted)
            and torch.equal(got[1], expected.output_token_ids)
        ),
        "ms": round(ms, 4),
        "ref_ms": round(ref_ms, 4),
        "speedup_vs_ref": round(ref_ms / ms, 3),
    }


def cases(quick: bool, every_case: bool = False):
    """(name, run) pairs; quick: fewer repetitions, and only the first five unless every_case."""
    yield "decode_b256_ctx1000", lambda: decode_case(256, 1000, 16, 8, 128, None, quick)
    yield "decode_b4_ctx8000_split", lambda: decode_case(4, 8000, 16, 8, 128, None, quick)
    yield "decode_b4_ctx8000_nosplit", lambda: decode_case(4, 8000, 16, 8, 128, 1, quick)
    yield "prefill_4096", lambda: prefill_case([4096], 16, 8, 128, quick)
    yield "sample_plain_b256_v151936", lambda: sample_plain_case(256, 151936, quick)
    if quick and not every_case:
        return
    yield "decode_b1_ctx1000", lambda: decode_case(1, 1000, 16, 8, 128, None, quick)
    yield "decode_b64_ctx2000", lambda: decode_case(64, 2000, 16, 8, 128, None, quick)
    yield "decode_b256_ctx1000_hd64_32_8", lambda: decode_case(256, 1000, 32, 8, 64, None, quick)
    yield "prefill_1000", lambda: prefill_case([1000], 16, 8, 128, quick)
    yield "prefill_8x512", lambda: prefill_case([512] * 8, 16, 8, 128, quick)
    yield "prefill_4096_32_8", lambda: prefill_case([4096], 32, 8, 128, quick)
    yield "fused_ops_8192", lambda: fused_ops_case(8192, 1024, 3072, quick)
    yield "sample_plain_b1024_v151936", lambda: sample_plain_case(1024, 151936, quick)
    for batch in (1, 64, 256, 1024):
        yield f"filter_b{batch}_v151936", lambda b=batch: filter_case(b, 151936, quick)
    for rows, k in ((1, 5), (128, 5), (1024, 5), (1024, 20)):
        yield f"logprobs_r{rows}_k{k}", lambda r=rows, k=k: logprobs_case(r, k, 151936, quick)
    for rows, vocab in ((1, 151936), (256, 49152), (256, 151936)):
        yield f"bitmask_r{rows}_v{vocab}", lambda r=rows, v=vocab: bitmask_case(r, v, quick)
    for rows, drafts in ((1, 4), (256, 4), (256, 16)):
        yield f"verify_r{rows}_k{drafts}", lambda r=rows, k=drafts: verify_case(r, k, quick)
    # Config sweeps for the tables in decode_attention.py / prefill_attention.py.
    for cfg in ((32, 4, 2), (64, 4, 2), (64, 8, 3), (128, 4, 2), (128, 8, 3)):
        yield (
            f"sweep_decode_b256_ctx1000_{cfg}",
            lambda c=cfg: {**decode_case(256, 1000, 16, 8, 128, None, quick, c), "config": c},
        )
    # (block_m, block_n, num_warps, num_stages); the first line of each sweep is the default.
    # num_stages 2 leaves K/V load latency exposed; >= 3 keeps two tiles in flight.
    for cfg in (
        (128, 64, 8, 3),
        (128, 128, 8, 3),  # 224 KB shared memory: at the limit
        (128, 128, 8, 2),
        (128, 64, 8, 4),
        (128, 32, 8, 4),
        (128, 64, 4, 3),
        (64, 64, 4, 3),
    ):
        yield (
            f"sweep_prefill_4096_{cfg}",
            lambda c=cfg: prefill_case([4096], 16, 8, 128, quick, c),
        )
    for cfg in ((64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (128, 64, 8, 3), (32, 64, 4, 3)):
        yield (
            f"sweep_prefill_1000_{cfg}",
            lambda c=cfg: prefill_case([1000], 16, 8, 128, quick, c),
        )
    # The `long` workload's steps: one 16k-token prompt a step, then ~16 decodes at 16k.
    for cfg in (
        None,
        (128, 128, 8, 2),
        (128, 64, 4, 3),
        (128, 32, 8, 4),
        (64, 64, 4, 3),
        (128, 64, 8, 4),
        (128, 64, 8, 2),
        (256, 64, 8, 2),
        (64, 128, 4, 3),
    ):
        yield (
            f"long_prefill_16384_{cfg}",
            lambda c=cfg: prefill_case([16384], 16, 8, 128, quick, c),
        )
    for splits in (None, 1, 2, 4, 8, 16):
        yield (
            f"long_decode_b16_ctx16384_splits{splits}",
            lambda s=splits: decode_case(16, 16384, 16, 8, 128, s, quick),
        )
    # The headline's decode steps: contexts of mixed lengths, row order vs longest first.
    for batch, ctx in ((256, 1000), (256, 2000), (128, 1500), (96, 2000), (64, 4000)):
        yield (
            f"mixed_decode_b{batch}_ctx{ctx}",
            lambda b=batch, c=ctx: mixed_decode_case(b, c, quick),
        )
    # The headline's tail: the batch shrinks as requests finish (programs = batch * kv heads
    # around one wave of SMs).
    for batch in (8, 16, 17, 24, 32, 48, 64, 128):
        for splits in (None, 1, 2, 3, 4, 5, 8):
            yield (
                f"tail_decode_b{batch}_ctx1500_splits{splits}",
                lambda b=batch, s=splits: decode_case(b, 1500, 16, 8, 128, s, quick),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the five headline cases, fewer reps")
    parser.add_argument("--only", default="", help="run the cases whose name starts with this")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA GPU")
    torch.manual_seed(0)
    meta = {
        "device": torch.cuda.get_device_name(0),
        "triton": triton.__version__,
        "torch": torch.__version__,
    }
    for name, run in cases(args.quick, every_case=bool(args.only)):
        if not name.startswith(args.only):
            continue
        try:
            result = run()
            print(json.dumps({"case": name, **result, **meta}), flush=True)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            print(
                json.dumps(
                    {"case": name, "error": repr(e), "trace": traceback.format_exc()[-800:]}
                ),
                flush=True,
            )
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
