"""What a KV cache's number format alone costs in accuracy: HF transformers in float32 on the
CPU, with K (after RoPE) and V rounded to a format before every attention and nothing else
changed, against the same model unrounded. Teacher-forced top-1 agreement and the error of
the reference token's logprob, one JSON line per format.

The model is the GPU tests' random parity model (minivllm.tiny_model.make_parity_model_dir:
Qwen3-0.6B's shape, random weights, embeddings x 8), on which the fp8 cache's
accuracy target is set (top-1 within 0.5 % of the bf16 cache's).

Usage: python -m benchmarks.checks.kv_format_accuracy [--prompts 4] [--length 256]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def per_token_head(x: torch.Tensor, qmax: float, rounding) -> torch.Tensor:
    """x scaled per (token, head) so that its largest magnitude is qmax, rounded, scaled back."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / qmax
    return rounding(x / scale) * scale


FORMATS = {
    "bf16": lambda x: x.bfloat16().float(),
    "fp16": lambda x: x.half().float(),
    # kv_cache_dtype="fp8": e4m3 at scale 1.0, saturating at +-448 (kernels/kv_store.py).
    "fp8_e4m3": lambda x: x.clamp(-448, 448).to(E4M3).float(),
    "fp8_e5m2": lambda x: x.clamp(-57344, 57344).to(E5M2).float(),
    "fp8_e4m3_token_head_scale": lambda x: per_token_head(x, 448.0, lambda y: y.to(E4M3).float()),
    "int8_token_head_scale": lambda x: per_token_head(
        x, 127.0, lambda y: y.round().clamp(-127, 127)
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    args = parser.parse_args()
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from minivllm.tiny_model import make_parity_model_dir, parity_prompts

    rounding = {"format": None}

    def rounded_attention(module, query, key, value, *rest, **kwargs):
        f = rounding["format"] or (lambda x: x)
        return sdpa_attention_forward(module, query, f(key), f(value), *rest, **kwargs)

    AttentionInterface.register("kv_rounded", rounded_attention)
    model_dir = make_parity_model_dir(
        "qwen3-0.6b", os.path.join(tempfile.gettempdir(), "minivllm-kv-format-parity")
    )
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="kv_rounded"
    )
    prompts = parity_prompts(args.prompts, args.length)

    def logprobs() -> list[torch.Tensor]:
        with torch.no_grad():
            return [model(torch.tensor([p])).logits[0, :-1].log_softmax(-1) for p in prompts]

    reference = logprobs()
    ref_tokens = torch.cat([r.argmax(-1) for r in reference])
    for name, fmt in FORMATS.items():
        rounding["format"] = fmt
        start = time.perf_counter()
        rows = logprobs()
        top1 = torch.cat([r.argmax(-1) for r in rows])
        errors = torch.cat([
            (r.gather(-1, ref.argmax(-1, keepdim=True)) - ref.amax(-1, keepdim=True)).abs()[:, 0]
            for r, ref in zip(rows, reference, strict=True)
        ])  # fmt: skip
        print(json.dumps({
            "bench": "kv_format_accuracy",
            "format": name,
            "positions": len(top1),
            "top1_vs_unrounded": round((top1 == ref_tokens).float().mean().item(), 4),
            "ref_token_logprob_abs_err_mean": round(errors.mean().item(), 4),
            "seconds": round(time.perf_counter() - start, 1),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
