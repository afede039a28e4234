"""llguidance's thread pool at large batch, by where the matchers come from (no engine, no
GPU): 256 matchers of bench_structured.py's JSON schema, each step one batched mask fill and
an advance by a random allowed token: matcher after matcher on the calling thread, as the
engine's step does, and on alternate steps one batched call on the pool instead.

    python -m benchmarks.cpu.bench_llguidance_pool_cpu [--threads 1,4,12] [--num-seqs 256]
        [--tokenizer DIR]

Per thread count, three sources: deep copies of one template ("copies": they share its lexer
state behind one mutex), deep copies of one template per thread in turn ("lanes": what the
backend does for a shared grammar), and matchers each built on its own ("fresh"). Prints one
JSON line per case: median milliseconds a step of the fill and of each advance.
DIR: an HF tokenizer directory (default: the demo model's tokenizer).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import llguidance
import llguidance.hf
import numpy as np

from benchmarks.engine.bench_structured import SCHEMA
from minivllm.structured_output.bitmask import allocate_bitmask


def load_tokenizer(path: str | None):
    if path is not None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    from minivllm.demo_model import demo_gguf_file
    from minivllm.tokenizer import load_tokenizer as load_demo

    return load_demo(demo_gguf_file())


def allowed_token(row: np.ndarray, rng: random.Random) -> int:
    """A random token among those a bitmask row (uint32 words) allows."""
    words = np.flatnonzero(row)
    word = int(words[rng.randrange(len(words))])
    bits = [b for b in range(32) if int(row[word]) >> b & 1]
    return word * 32 + rng.choice(bits)


def run_case(tokenizer, grammar: str, source: str, threads: int, num_seqs: int, steps: int):
    pool = llguidance.LLExecutor(threads)
    templates = []
    for _ in range(threads if source == "lanes" else 1):
        template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        template.compute_bitmask()
        templates.append(template)

    def new(i: int) -> llguidance.LLMatcher:
        if source == "fresh":
            return llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        return templates[i % len(templates)].deep_copy()

    matchers = [new(i) for i in range(num_seqs)]
    bitmask = allocate_bitmask(num_seqs, tokenizer.vocab_size)
    words = bitmask.shape[1]
    rng = random.Random(0)
    fills, advances, pool_advances = [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        pairs = [(m, i) for i, m in enumerate(matchers)]
        pool.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), words * 4, num_seqs)
        fills.append(time.perf_counter() - start)
        rows = bitmask.numpy().view(np.uint32)
        tokens = [allowed_token(rows[i], rng) for i in range(num_seqs)]
        start = time.perf_counter()
        if len(fills) % 2:
            pool.consume_token_par(list(zip(matchers, tokens)))
            pool_advances.append(time.perf_counter() - start)
        else:
            for matcher, token in zip(matchers, tokens):
                matcher.consume_token(token)
            advances.append(time.perf_counter() - start)
        for i, m in enumerate(matchers):  # a finished request is replaced
            if m.is_stopped() or m.is_error():
                matchers[i] = new(i)
    skip = steps // 8  # the first steps build the lexer states (of each kind of advance)
    return {
        "bench": "llguidance_pool_cpu",
        "source": source,
        "threads": threads,
        "num_seqs": num_seqs,
        "fill_ms": round(statistics.median(fills[skip:]) * 1e3, 3),
        "advance_ms": round(statistics.median(advances[skip:]) * 1e3, 3),
        "advance_pool_ms": round(statistics.median(pool_advances[skip:]) * 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--tokenizer", default=None)
    args = parser.parse_args()
    tokenizer = llguidance.hf.from_tokenizer(load_tokenizer(args.tokenizer))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    for threads in (int(t) for t in args.threads.split(",")):
        for source in ("copies", "lanes", "fresh"):
            case = run_case(tokenizer, grammar, source, threads, args.num_seqs, args.steps)
            print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main()
