"""Resident memory a compiled grammar holds, against grammar_bytes' estimate: compiles distinct
JSON schemas of a few sizes and a few regexes on one lane (llguidance backend, the demo model's
tokenizer), prints one JSON line: per size, measured bytes a grammar, the estimate, the ratio.

    python -m benchmarks.cpu.bench_grammar_memory_cpu
"""

from __future__ import annotations

import gc
import json
import os
import time

from minivllm.demo_model import demo_gguf_file
from minivllm.structured_output.llguidance_backend import LLGuidanceBackend
from minivllm.structured_output.params import StructuredOutputsParams
from minivllm.tokenizer import load_tokenizer

SHAPES = ((5, 200), (50, 100), (200, 40), (450, 20))  # (properties, distinct schemas)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(backend: LLGuidanceBackend, specs: list) -> dict:
    kept = []
    gc.collect()
    before, start = rss_bytes(), time.perf_counter()
    for spec in specs:
        kept.append(backend.compile(spec))
    seconds = time.perf_counter() - start
    gc.collect()
    measured = (rss_bytes() - before) / len(specs)
    estimate = sum(backend.grammar_bytes(g) for g in kept) / len(specs)
    return {
        "measured_bytes": round(measured),
        "estimate_bytes": round(estimate),
        "estimate_over_measured": round(estimate / max(measured, 1), 2),
        "compile_ms": round(seconds / len(specs) * 1e3, 1),
    }


def main() -> None:
    backend = LLGuidanceBackend(load_tokenizer(demo_gguf_file()), num_threads=1)
    results = {}
    for num_props, count in SHAPES:
        specs = [
            StructuredOutputsParams(
                json={
                    "type": "object",
                    "properties": {
                        f"p{k}_{i}": {"type": "string" if i % 2 else "integer"}
                        for i in range(num_props)
                    },
                }
            ).spec_key()
            for k in range(count)
        ]
        results[f"json_{num_props}_properties"] = measure(backend, specs)
    regexes = [StructuredOutputsParams(regex=f"x{k}[a-z]{{1,{100 + k}}}") for k in range(50)]
    results["regex"] = measure(backend, [r.spec_key() for r in regexes])
    print(json.dumps({"bench": "grammar_memory", "vocab_size": backend.vocab_size, **results}))


if __name__ == "__main__":
    main()
