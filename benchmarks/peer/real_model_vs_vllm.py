"""Greedy outputs of minivllm and vLLM on the same real checkpoint; prints one JSON line.

Each engine runs in its own process (vLLM lives on its own PYTHONPATH); `compare` reads both
files: the fraction of identical outputs and, for the rest, the first position that differs.

    python -m benchmarks.peer.real_model_vs_vllm convert /tmp/smollm2          # the demo GGUF -> HF
    python -m benchmarks.peer.real_model_vs_vllm run minivllm /tmp/smollm2 /tmp/ours.json
    PYTHONPATH=/tmp/vsite python -m benchmarks.peer.real_model_vs_vllm run vllm /tmp/smollm2 \
        /tmp/v.json
    python -m benchmarks.peer.real_model_vs_vllm compare /tmp/ours.json /tmp/v.json
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.checks.real_model_fidelity import TEMPLATES, TOPICS


def prompts(model_dir: str, num_prompts: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for i in range(num_prompts):
        text = TEMPLATES[(i // len(TOPICS)) % len(TEMPLATES)].format(TOPICS[i % len(TOPICS)])
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def run(engine: str, model_dir: str, out_path: str, args: argparse.Namespace) -> None:
    prompt_ids = prompts(model_dir, args.num_prompts)
    inputs = [{"prompt_token_ids": p} for p in prompt_ids]
    if engine == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(model_dir, dtype=args.dtype, gpu_memory_utilization=0.5, seed=0)
    else:
        from minivllm import LLM, SamplingParams

        llm = LLM(model_dir, dtype=args.dtype, gpu_memory_utilization=0.5)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    with open(out_path, "w") as f:
        json.dump({"engine": engine, "dtype": args.dtype, "prompts": prompt_ids, "tokens": tokens,
                   "elapsed_s": elapsed}, f)  # fmt: skip


def compare(path_a: str, path_b: str) -> None:
    with open(path_a) as f:
        a = json.load(f)
    with open(path_b) as f:
        b = json.load(f)
    if a["prompts"] != b["prompts"]:
        raise SystemExit("the two runs tokenized different prompts")
    first_diff = []
    for x, y in zip(a["tokens"], b["tokens"], strict=True):
        if x != y:
            first_diff.append(next(i for i, (s, t) in enumerate(zip(x, y)) if s != t))
    num = len(a["tokens"])
    print(json.dumps({
        "bench": "real_model_vs_vllm",
        "engines": [a["engine"], b["engine"]],
        "dtype": [a["dtype"], b["dtype"]],
        "num_prompts": num,
        "max_tokens": len(a["tokens"][0]),
        "identical_fraction": (num - len(first_diff)) / num,
        "first_divergence_positions": sorted(first_diff),
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["convert", "run", "compare"])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    if args.command == "convert":
        from minivllm.demo_model import demo_gguf_file
        from minivllm.gguf_convert import convert_gguf_to_hf

        print(convert_gguf_to_hf(demo_gguf_file(), args.paths[0]))
    elif args.command == "run":
        run(args.paths[0], args.paths[1], args.paths[2], args)
    else:
        compare(args.paths[0], args.paths[1])


if __name__ == "__main__":
    main()
