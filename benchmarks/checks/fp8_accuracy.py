"""What FP8 weights cost in accuracy: the engine with block-FP8 weights (`quantization="fp8"`,
quantized at load: 128 x 128 blocks, activations per token-group of 128) against HF transformers
in float32 with the same weights dequantized, teacher-forced. One JSON line per engine run: top-1
agreement and the error of our top-1 token's logprob. The engine in bf16 with the original
weights runs against the same reference, for scale (its gap is the weights' rounding alone).

The model is the GPU tests' random parity model (minivllm.tiny_model.make_parity_model_dir:
Qwen3-0.6B's shape, random bf16 weights, embeddings x 8), or --model DIR (an HF checkpoint in
bf16; the reference holds it in float32).

Usage: python -m benchmarks.checks.fp8_accuracy [--prompts 4] [--length 256] [--model DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time

import torch

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def dequantized_reference(model_dir: str, device: str):
    """HF float32 with every decoder linear weight replaced by its block-FP8 round trip."""
    from transformers import AutoModelForCausalLM

    from minivllm.layers.quantization.fp8_math import dequantize_blocks, quantize_weight_blocks

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in LINEARS:
                module.weight.copy_(dequantize_blocks(*quantize_weight_blocks(module.weight)))
    return model.eval()


def reference_logprobs(model_dir: str, prompts: list[list[int]], device: str) -> list:
    model = dequantized_reference(model_dir, device)
    with torch.no_grad():
        rows = [
            model(torch.tensor([p], device=device)).logits[0, :-1].float().log_softmax(-1).cpu()
            for p in prompts
        ]
    del model
    gc.collect()
    return rows


def engine_top1(model_dir: str, prompts: list[list[int]], **options) -> list:
    """(top-1 token, its logprob) at each position but the last, teacher-forced."""
    from minivllm import LLM, SamplingParams

    llm = LLM(model_dir, seed=0, **options)
    params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.shutdown()
    rows = []
    for out in outputs:
        # prompt_logprobs[0] is None (nothing predicts the first token); entry i predicts i.
        entries = out.prompt_logprobs[1:]
        rows.append([
            next((tok, lp.logprob) for tok, lp in entry.items() if lp.rank == 1)
            for entry in entries
        ])  # fmt: skip
    return rows


def figures(reference: list, ours: list) -> dict:
    agree, errors = [], []
    for ref, row in zip(reference, ours, strict=True):
        for pos, (token, logprob) in enumerate(row):
            agree.append(token == int(ref[pos].argmax()))
            errors.append(abs(logprob - float(ref[pos, token])))
    errors_t = torch.tensor(errors)
    return {
        "positions": len(agree),
        "top1_vs_dequantized_fp32": round(sum(agree) / len(agree), 4),
        "top1_logprob_abs_err_mean": round(errors_t.mean().item(), 4),
        "top1_logprob_abs_err_max": round(errors_t.max().item(), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--model", default=None, help="an HF checkpoint (bf16) instead")
    args = parser.parse_args()
    from minivllm.tiny_model import make_parity_model_dir, parity_prompts

    model_dir = args.model or make_parity_model_dir(
        "qwen3-0.6b", os.path.join(tempfile.gettempdir(), "minivllm-fp8-parity")
    )
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    prompts = [[t % vocab_size for t in p] for p in parity_prompts(args.prompts, args.length)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference = reference_logprobs(model_dir, prompts, device)
    for name, options in (("fp8", {"quantization": "fp8"}), ("bf16_original", {})):
        if device == "cpu":
            options = {**options, "dtype": "bfloat16"}
        start = time.perf_counter()
        rows = engine_top1(model_dir, prompts, **options)
        print(json.dumps({
            "bench": "fp8_accuracy",
            "weights": name,
            "model": args.model or "parity qwen3-0.6b",
            "device": device,
            **figures(reference, rows),
            "seconds": round(time.perf_counter() - start, 1),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
