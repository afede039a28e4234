"""Batch-1 speculative decoding on real text: prompts that quote and edit their own text (a code
edit, a paragraph to rewrite, a summary with quotes), greedy, through either engine's vLLM-style
API. Prints one JSON line: TPOT (median over the prompts), the mean accepted length and the
outputs' token ids' hash (equal across engines' runs only if the texts are).

    python -m benchmarks.peer.real_model_vs_vllm convert /tmp/smollm2      # the demo GGUF -> HF
    python -m benchmarks.engine.bench_spec_decode minivllm /tmp/smollm2 [--spec '{"method": "ngram",
        "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}']
    PYTHONPATH=/tmp/vsite python -m benchmarks.engine.bench_spec_decode vllm /tmp/smollm2 --spec ...

TPOT of a prompt: (time of its full generate - time of a one-token generate of it) / (output
tokens - 1), each alone, prefix caching off (a TTFT that hits the cache would flatter TPOT).

    python -m benchmarks.engine.bench_spec_decode minivllm /tmp/smollm2 --batch 1,8,32,64 \
        [--spec ...]

--batch: instead, for each batch size B, generates of B prompts (the tasks in turn) and their
output tokens per second (median of three generates): where speculation stops paying as the
batch grows (`disable_by_batch_size`). One JSON line per batch size.

    python -c "from minivllm.tiny_model import make_dummy_model_dir as m; \
        m('qwen3-8b', '/tmp/q8'); m('qwen3-0.6b', '/tmp/q06')"
    python -m benchmarks.engine.bench_spec_decode minivllm /tmp/q8 --draft /tmp/q06 \
        --synthetic 1.5,2.5,3.5
    PYTHONPATH=/tmp/vsite python -m benchmarks.engine.bench_spec_decode vllm /tmp/q8 \
        --draft /tmp/q06 --synthetic 1.5,2.5,3.5

--synthetic: the draft model's speedup at forced mean acceptance lengths (vLLM's
rejection_sample_method "synthetic": drafts are kept with fixed probabilities, whatever the
target says), on dummy weights (load_format="dummy", target and draft). Batch-1 TPOT as above,
greedy, every request max_tokens long (ignore_eos), for no speculation and for each length L
with {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4,
"rejection_sample_method": "synthetic", "synthetic_acceptance_length": L}; each configuration
in its own process (the GPU memory of one engine is gone before the next starts). One JSON
line per L: TPOT, speedup over no speculation, the measured mean acceptance length.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time

CODE = """def merge_intervals(intervals):
    intervals.sort(key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def total_length(intervals):
    return sum(end - start for start, end in merge_intervals(intervals))
"""

PARAGRAPH = (
    "The lighthouse on the northern cape was built in 1874 from granite blocks that were "
    "carried by ship from the quarry at Rosvik. For ninety years a keeper lived in the small "
    "house beside it, climbing the one hundred and twelve steps every evening to light the "
    "lamp. In 1964 the light was automated and the keeper's house became a museum, which "
    "still shows the logbooks in which every passing ship was recorded."
)

TASKS = [
    f"Add type hints and a docstring to each function below. Repeat the code in full.\n\n{CODE}",
    f"Rename the function merge_intervals to merge in this code and show all of it:\n\n{CODE}",
    f"Rewrite this paragraph in the present tense, keeping every detail:\n\n{PARAGRAPH}",
    f"Quote the sentences of this text that contain a number, one per line:\n\n{PARAGRAPH}",
    f"Correct the grammar of the following text and return it in full:\n\n{PARAGRAPH}",
    f"Convert this code to use a while loop instead of the for loop; show the result:\n\n{CODE}",
]


# Draft tokens per step in --synthetic runs.
SYNTHETIC_NUM_SPECULATIVE_TOKENS = 4


def prompts(model_dir: str) -> list[list[int]]:
    """The tasks as chat prompts; plain text where the tokenizer has no chat template (a
    dummy model's word-level one: only the lengths matter there)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for text in TASKS:
        if tokenizer.chat_template is None:
            out.append(list(tokenizer(text)["input_ids"]))
            continue
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def build(engine: str, model_dir: str, spec: dict | None, load_format: str = "auto"):
    options = {"enable_prefix_caching": False, "gpu_memory_utilization": 0.5, "seed": 0}
    options.update(max_model_len=4096, load_format=load_format)
    if spec is not None:
        options["speculative_config"] = dict(spec)  # vLLM writes into the dict it is given
    if engine == "vllm":
        from vllm import LLM, SamplingParams

        return LLM(model_dir, disable_log_stats=False, **options), SamplingParams
    from minivllm import LLM, SamplingParams

    return LLM(model_dir, **options), SamplingParams


def accepted_length(engine: str, llm) -> float | None:
    """1 + accepted drafts per drafting step, from the engine's own counters."""
    if engine == "minivllm":
        from minivllm.spec_decode.metrics import mean_acceptance_length

        speculator = llm.engine.scheduler.speculator
        return None if speculator is None else round(mean_acceptance_length(speculator.stats), 3)
    counts = {}
    for metric in llm.get_metrics():
        if metric.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"):
            counts[metric.name] = metric.value
    if len(counts) < 2 or not counts["vllm:spec_decode_num_drafts"]:
        return None
    ratio = counts["vllm:spec_decode_num_accepted_tokens"] / counts["vllm:spec_decode_num_drafts"]
    return round(1 + ratio, 3)


def batch1_tpot(
    llm, sampling_params, prompt_ids: list[list[int]], max_tokens: int, ignore_eos: bool = False
) -> tuple[list[float], list[list[int]]]:
    """Per prompt, alone: TPOT in seconds (prompts with one output token left out) and the
    output token ids; after a warm-up generate."""

    def timed(prompt: list[int], num_tokens: int) -> tuple[float, list[int]]:
        params = sampling_params(temperature=0.0, max_tokens=num_tokens, ignore_eos=ignore_eos)
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        return time.perf_counter() - start, list(out[0].outputs[0].token_ids)

    timed(prompt_ids[0], 16)  # warm-up
    tpots, tokens = [], []
    for prompt in prompt_ids:
        first, _ = timed(prompt, 1)
        full, ids = timed(prompt, max_tokens)
        tokens.append(ids)
        if len(ids) > 1:
            tpots.append((full - first) / (len(ids) - 1))
    return tpots, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=["minivllm", "vllm"])
    parser.add_argument("model_dir")
    parser.add_argument("--spec", type=json.loads, default=None)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", default=None, help="comma-separated batch sizes")
    parser.add_argument(
        "--synthetic",
        default=None,
        help="comma-separated mean acceptance lengths (needs --draft; dummy weights)",
    )
    parser.add_argument("--draft", default=None, help="the draft model's directory (--synthetic)")
    # One configuration of --synthetic, in a child process: a length, or "none".
    parser.add_argument("--synthetic-run", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.synthetic is not None:
        synthetic_speedups(args)
        return
    if args.synthetic_run is not None:
        synthetic_run(args)
        return
    prompt_ids = prompts(args.model_dir)
    llm, sampling_params = build(args.engine, args.model_dir, args.spec)
    if args.batch is not None:
        batch_throughput(args, llm, sampling_params, prompt_ids)
        return
    tpots, tokens = batch1_tpot(llm, sampling_params, prompt_ids, args.max_tokens)
    digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:12]
    print(
        json.dumps(
            {
                "engine": args.engine,
                "spec": args.spec,
                "tpot_ms": round(statistics.median(tpots) * 1e3, 3),
                "tpot_ms_each": [round(t * 1e3, 3) for t in tpots],
                "output_tokens": [len(t) for t in tokens],
                "mean_accepted_length": accepted_length(args.engine, llm),
                "tokens_sha": digest,
            }
        ),
        flush=True,
    )


def synthetic_spec(draft_dir: str, length: float) -> dict:
    return {
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": SYNTHETIC_NUM_SPECULATIVE_TOKENS,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": length,
    }


def synthetic_run(args) -> None:
    """One configuration of --synthetic (this process's only engine): prints its TPOT and
    measured mean acceptance length as a JSON line starting with {"tpot_ms"."""
    length = None if args.synthetic_run == "none" else float(args.synthetic_run)
    spec = None if length is None else synthetic_spec(args.draft, length)
    llm, sampling_params = build(args.engine, args.model_dir, spec, load_format="dummy")
    prompt_ids = prompts(args.model_dir)
    tpots, tokens = batch1_tpot(llm, sampling_params, prompt_ids, args.max_tokens, ignore_eos=True)
    result = {
        "tpot_ms": round(statistics.median(tpots) * 1e3, 3),
        "output_tokens": [len(t) for t in tokens],
        "mean_accepted_length": accepted_length(args.engine, llm),
    }
    print(json.dumps(result), flush=True)


def synthetic_speedups(args) -> None:
    """--synthetic: no speculation, then each length, each in a child process."""
    if args.draft is None:
        raise SystemExit("--synthetic needs --draft DIR (the draft model)")
    lengths = [float(x) for x in args.synthetic.split(",")]
    results = {}
    for length in [None, *lengths]:
        cmd = [
            sys.executable,
            "-m",
            __spec__.name,
            args.engine,
            args.model_dir,
            "--draft",
            args.draft,
        ]
        cmd += [
            "--max-tokens",
            str(args.max_tokens),
            "--synthetic-run",
            "none" if length is None else str(length),
        ]
        stdout = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        # The engine may log to stdout too (vLLM does), also after the result line.
        line = next(x for x in reversed(stdout.splitlines()) if x.startswith('{"tpot_ms"'))
        results[length] = json.loads(line)
    base = results[None]["tpot_ms"]
    for length in lengths:
        result = results[length]
        print(
            json.dumps(
                {
                    "engine": args.engine,
                    "model": args.model_dir,
                    "draft": args.draft,
                    "num_speculative_tokens": SYNTHETIC_NUM_SPECULATIVE_TOKENS,
                    "synthetic_acceptance_length": length,
                    "max_tokens": args.max_tokens,
                    "tpot_ms": result["tpot_ms"],
                    "tpot_ms_no_spec": base,
                    "speedup": round(base / result["tpot_ms"], 3),
                    "mean_accepted_length": result["mean_accepted_length"],
                    "output_tokens": result["output_tokens"],
                }
            ),
            flush=True,
        )


def batch_throughput(args, llm, sampling_params, prompt_ids: list[list[int]]) -> None:
    params = sampling_params(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
    for batch in [int(b) for b in args.batch.split(",")]:
        batch_prompts = [
            {"prompt_token_ids": prompt_ids[i % len(prompt_ids)]} for i in range(batch)
        ]
        times = []
        for _ in range(3):  # the median of three: one generate of a small batch is short
            start = time.perf_counter()
            outs = llm.generate(batch_prompts, params, use_tqdm=False)
            times.append(time.perf_counter() - start)
        elapsed = statistics.median(times)
        num_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(
            json.dumps(
                {
                    "engine": args.engine,
                    "spec": args.spec,
                    "batch": batch,
                    "output_tok_s": round(num_tokens / elapsed, 1),
                    "seconds": round(elapsed, 3),
                    "output_tokens": num_tokens,
                    "mean_accepted_length": accepted_length(args.engine, llm),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
