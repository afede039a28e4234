"""The attention half of tune_deterministic.py: batch-invariant attention tile configs against
the default decode and prefill kernels at headline-like shapes (16 q / 8 kv heads, head_dim 128,
decode batch 256 with contexts 200-2000, a prefill chunk of 16 x 512 tokens). A config pair
(prefill tiles, decode tiles) sharing BLOCK_N is admitted only if decode rows, walked or split,
equal the same tokens' prefill rows bit for bit."""

from __future__ import annotations

import json
import random
from functools import partial
from itertools import product

import torch

from minivllm.kernels.batch_invariant_attention import (
    SEG_N,
    batch_invariant_attention,
    batch_invariant_config,
)
from minivllm.kernels.decode_attention import choose_num_splits, decode_attention
from minivllm.kernels.prefill_attention import prefill_attention

DECODE_STEPS, PREFILL_CHUNKS = 523, 17  # headline: 133,966 outputs / 256; 142,827 prompt / 8,192


def dims(smoke: bool) -> dict:
    if smoke:
        return {
            "heads": 4,
            "kv_heads": 2,
            "head_dim": 32,
            "block": 8,
            "seg_n": 32,
            "positions": [0, 15, 16, 31, 32, 33, 63, 64, 69],
            "length": 70,
        }
    return {
        "heads": 16,
        "kv_heads": 8,
        "head_dim": 128,
        "block": 16,
        "seg_n": SEG_N,
        "positions": [0, 63, 64, 511, 512, 513, 1023, 1024, 1499],
        "length": 1500,
    }


def candidates(smoke: bool) -> list[tuple[str, tuple]]:
    """("prefill", (block_m, block_n, warps, stages)) and ("decode", same) pairs to try."""
    if smoke:
        return [
            ("prefill", (16, 16, 4, 1)),
            ("prefill", (32, 16, 4, 1)),
            ("decode", (16, 16, 4, 1)),
            ("decode", (32, 16, 4, 1)),
        ]
    out = [
        ("prefill", (bm, bn, w, s))
        for bn, bm, w, s in product((32, 64, 128), (64, 128), (4, 8), (2, 3))
    ]
    out += [
        ("decode", (bm, bn, 4, s)) for bn, bm, s in product((32, 64, 128), (16, 32, 64), (2, 3, 4))
    ]
    return out + [("decode", (64, bn, 8, 3)) for bn in (32, 64, 128)]


def _paged(lens: list[int], d: dict, device: str, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.float16 if device == "cpu" else torch.bfloat16
    counts = [-(-n // d["block"]) for n in lens]
    cache = torch.randn(
        2, sum(counts) + 1, d["block"], d["kv_heads"], d["head_dim"], device=device, generator=gen
    ).to(dtype)
    perm = torch.randperm(sum(counts), device=device, generator=gen).int() + 1
    table = torch.zeros(len(lens), max(counts), dtype=torch.int32, device=device)
    start = 0
    for i, c in enumerate(counts):
        table[i, :c] = perm[start : start + c]
        start += c
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return cache, table, seq_lens, gen, dtype


def _run(case: dict, config: tuple, decode: bool, segs: int = 0, parts: dict | None = None):
    out = torch.empty_like(case["q"])
    return batch_invariant_attention(
        case["q"],
        case["cache"],
        case["qsl"],
        case["lens"],
        case["table"],
        case["scale"],
        out,
        seg_n=case["seg_n"],
        config=config,
        decode_rows=decode,
        num_segments=segs,
        **(parts or {}),
    )


def decode_case(lens: list[int], d: dict, device: str) -> dict:
    cache, table, seq_lens, gen, dtype = _paged(lens, d, device)
    q = torch.randn(len(lens), d["heads"], d["head_dim"], device=device, generator=gen).to(dtype)
    qsl = torch.arange(len(lens) + 1, dtype=torch.int32, device=device)
    return {
        "q": q,
        "cache": cache,
        "table": table,
        "lens": seq_lens,
        "qsl": qsl,
        "scale": d["head_dim"] ** -0.5,
        "seg_n": d["seg_n"],
    }


def prefill_case(lens: list[int], d: dict, device: str) -> dict:
    cache, table, seq_lens, gen, dtype = _paged(lens, d, device, seed=1)
    q = torch.randn(sum(lens), d["heads"], d["head_dim"], device=device, generator=gen).to(dtype)
    qsl = torch.tensor([0] + lens, device=device).cumsum(0).int()
    return {
        "q": q,
        "cache": cache,
        "table": table,
        "lens": seq_lens,
        "qsl": qsl,
        "scale": d["head_dim"] ** -0.5,
        "seg_n": d["seg_n"],
    }


def _compile(pairs: list[tuple[str, tuple]], device: str, smoke: bool) -> list:
    """Worker: runs each config once on a tiny case with the real head shapes (the kernel
    specializes alike: batch-dependent ints are not specialized). Returns those that ran."""
    d = dims(smoke)
    dec, pre = decode_case([40, 9], d, device), prefill_case([40], d, device)
    ok = []
    for kind, config in pairs:
        try:
            _run(dec, config, True) if kind == "decode" else _run(pre, config, False)
            ok.append((kind, config))
        except Exception:  # out of resources: not a candidate
            pass
    if device == "cuda":
        torch.cuda.synchronize()
    return ok


def attn_jobs_inputs(workers: int, smoke: bool) -> list[list]:
    pairs = candidates(smoke)
    return [pairs[i::workers] for i in range(workers)]


def compile_attention(pool, workers: int, device: str, smoke: bool) -> list:
    return [pool.submit(_compile, part, device, smoke) for part in attn_jobs_inputs(workers, smoke)]


def _verifier(d: dict, device: str):
    """check(config, mode): the rows of a prefill (mode "prefill"), or of decodes walked
    ("decode") or split by segment ("split": compiles another variant), under config equal the
    reference prefill's of the same block_n, bitwise."""
    length, positions = d["length"], d["positions"]
    whole_case = prefill_case([length], d, device)
    rows = decode_case([p + 1 for p in positions], d, device)
    rows["q"] = whole_case["q"][positions].contiguous()
    rows["cache"] = whole_case["cache"]
    rows["table"] = whole_case["table"].expand(len(positions), -1).contiguous()
    segs = -(-length // d["seg_n"])
    shape = (len(positions), d["heads"], segs)
    parts = {
        "part_acc": torch.empty(*shape, d["head_dim"], device=device),
        "part_m": torch.empty(shape, device=device),
        "part_l": torch.empty(shape, device=device),
    }
    refs, seen = {}, {}

    def check(config: tuple, mode: str) -> bool:
        bn = config[1]
        if bn not in refs:
            ref = (64, bn, 4, 2) if device == "cuda" else (16, bn, 4, 1)
            refs[bn] = _run(whole_case, ref, False)
        if (config, mode) not in seen:
            if mode == "prefill":
                same = torch.equal(_run(whole_case, config, False), refs[bn])
            else:
                got = _run(rows, config, True, *((segs, parts) if mode == "split" else ()))
                same = torch.equal(got, refs[bn][positions])
            seen[(config, mode)] = same
            line = {"kind": "attn_bitwise", "tiles": mode, "config": config, "equal": same}
            print(json.dumps(line), flush=True)
        return seen[(config, mode)]

    return check


def tune_attention(timer, device: str, smoke: bool, ok: set) -> dict:
    """Times the default kernels, the current batch-invariant configs and every compiled
    candidate; returns {"decode": ms triple, "prefill": ms triple, "table": chosen configs}."""
    d = dims(smoke)
    rng = random.Random(0)
    lens = (
        [rng.randint(20, 70) for _ in range(4)]
        if smoke
        else [rng.randint(200, 2000) for _ in range(256)]
    )
    dec = decode_case(lens, d, device)
    pre = prefill_case([32, 32] if smoke else [512] * 16, d, device)
    n = len(lens)
    splits = choose_num_splits(n, d["kv_heads"], max(lens), 132)
    mid_o = torch.empty(n, d["heads"], 16, d["head_dim"], device=device)
    mid_lse = torch.empty(n, d["heads"], 16, device=device)
    out_d, out_p = torch.empty_like(dec["q"]), torch.empty_like(pre["q"])
    default_dec = timer(
        [
            lambda: decode_attention(
                dec["q"],
                dec["cache"],
                dec["table"],
                dec["lens"],
                dec["scale"],
                out_d,
                splits,
                mid_o,
                mid_lse,
            )
        ]
    )
    default_pre = timer(
        [
            lambda: prefill_attention(
                pre["q"], pre["cache"], pre["qsl"], pre["lens"], pre["table"], pre["scale"], out_p
            )
        ]
    )
    cur_dec_cfg = batch_invariant_config(d["head_dim"], 2, decode=True)
    cur_pre_cfg = batch_invariant_config(d["head_dim"], 2)
    if smoke:  # seg_n 32 needs small tiles
        cur_dec_cfg = cur_pre_cfg = (16, 16, 4, 1)
    current_dec = timer([lambda: _run(dec, cur_dec_cfg, True)])
    current_pre = timer([lambda: _run(pre, cur_pre_cfg, False)])
    times = {}
    for kind, config in sorted(ok):
        case = dec if kind == "decode" else pre
        try:
            times[(kind, config)] = timer([partial(_run, case, config, kind == "decode")])
        except Exception as err:  # does not run here: no candidate
            print(json.dumps({"kind": "warning", "config": config, "error": repr(err)}))
    check = _verifier(d, device)
    per_bn = {}
    for bn in sorted({c[1] for _, c in times}):
        best = {}
        for kind in ("prefill", "decode"):
            ranked = sorted(
                (c for k, c in times if k == kind and c[1] == bn), key=lambda c: times[(kind, c)]
            )
            for config in ranked[:5]:
                if check(config, kind):
                    best[kind] = (config, times[(kind, config)])
                    break
        if len(best) == 2:
            score = 28 * (DECODE_STEPS * best["decode"][1] + PREFILL_CHUNKS * best["prefill"][1])
            per_bn[bn] = {
                "prefill": best["prefill"],
                "decode": best["decode"],
                "headline_ms": score,
            }
    result = {
        "kind": "attention",
        "decode_b256_ctx200_2000": {
            "default_ms": default_dec,
            "current_ms": current_dec,
            "current_config": cur_dec_cfg,
        },
        "prefill_16x512": {
            "default_ms": default_pre,
            "current_ms": current_pre,
            "current_config": cur_pre_cfg,
        },
        "per_block_n": per_bn,
        "headline_attention_s": {
            "default": 28 * (DECODE_STEPS * default_dec + PREFILL_CHUNKS * default_pre) / 1e3,
            "current": 28 * (DECODE_STEPS * current_dec + PREFILL_CHUNKS * current_pre) / 1e3,
        },
    }
    print(json.dumps(result), flush=True)
    if not per_bn:  # nothing verified: the tables stay as they are
        return {
            "decode": {
                "default_ms": default_dec,
                "current_ms": current_dec,
                "tuned_ms": current_dec,
            },
            "prefill": {
                "default_ms": default_pre,
                "current_ms": current_pre,
                "tuned_ms": current_pre,
            },
        }
    bn = min(per_bn, key=lambda b: per_bn[b]["headline_ms"])
    choice = per_bn[bn]
    split_ok = check(choice["decode"][0], "split")
    return {
        "decode": {
            "default_ms": default_dec,
            "current_ms": current_dec,
            "tuned_ms": choice["decode"][1],
        },
        "prefill": {
            "default_ms": default_pre,
            "current_ms": current_pre,
            "tuned_ms": choice["prefill"][1],
        },
        "table": {
            "prefill": choice["prefill"][0],
            "decode": choice["decode"][0],
            "decode_split_equal": split_ok,
            "python": f"_CONFIGS (128, 2-byte) = {tuple(choice['prefill'][0])}; "
            f"_DECODE_CONFIGS[(128, 2)] = {tuple(choice['decode'][0][i] for i in (0, 2, 3))}",
        },
    }
