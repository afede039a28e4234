"""The benchmarks' workloads (docs/performance.md): token-id prompts and output lengths, seeded,
engine-free (the vLLM side of peer_workload_bench.py imports this file too).

headline: the standard small-engine workload. short: thousands of short requests. long: long
prompts, short outputs (prefill-bound). prefix: shared system prefixes (prefix-cache-bound).
chat: chat-like lengths with the sampling options real checkpoints and clients send;
chat-temperature the same requests with temperature alone; headline-qwen3 the headline with
Qwen3's generation_config (top-k 20, top-p 0.95).
random_prompts: the serving and batch-1 benchmarks' prompts (one length, random ids).
shifted: a workload's prompts with other ids, for runs on one engine that must not share a cache.
measure_batch1: batch-1 latency (TTFT and TPOT) through any engine's generate.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Random prompt ids are drawn from [0, MAX_TOKEN_ID], as in the headline workload.
MAX_TOKEN_ID = 10000


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[list[int]]
    output_lens: list[int]
    # Long enough for the longest prompt plus its output (both engines take this value).
    max_model_len: int
    # Per request, SamplingParams options on top of the benchmarks' defaults (vLLM's names,
    # which both engines take); None: the defaults alone (temperature 0.6).
    sampling: list[dict] | None = None

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(0, MAX_TOKEN_ID) for _ in range(n)]


def random_prompts(
    num_prompts: int, length: int, seed: int = 0, high: int = MAX_TOKEN_ID
) -> list[list[int]]:
    """num_prompts prompts of `length` random ids in [10, high] (the ids below 10 left out: a
    real tokenizer's special tokens sit there)."""
    rng = random.Random(seed)
    return [[rng.randint(10, high) for _ in range(length)] for _ in range(num_prompts)]


def headline(num_requests: int = 256, seed: int = 0) -> Workload:
    """The headline (docs/performance.md): prompts of randint(100, 1024) ids, then outputs of
    randint(100, 1024) (142,827 prompt and 133,966 output tokens for 256 requests)."""
    rng = random.Random(seed)
    prompts = [_ids(rng, rng.randint(100, 1024)) for _ in range(num_requests)]
    output_lens = [rng.randint(100, 1024) for _ in range(num_requests)]
    return Workload("headline", prompts, output_lens, max_model_len=4096)


def short(num_requests: int = 4096, seed: int = 0) -> Workload:
    """Many short requests: prompts of randint(16, 128) ids, outputs of randint(16, 512)."""
    rng = random.Random(seed)
    prompts = [_ids(rng, rng.randint(16, 128)) for _ in range(num_requests)]
    output_lens = [rng.randint(16, 512) for _ in range(num_requests)]
    return Workload("short", prompts, output_lens, max_model_len=4096)


def long(num_requests: int = 16, seed: int = 0, prompt_len: int = 16384) -> Workload:
    """Long prompts, short outputs: num_requests prompts of prompt_len ids, outputs of
    randint(32, 128)."""
    rng = random.Random(seed)
    prompts = [_ids(rng, prompt_len) for _ in range(num_requests)]
    output_lens = [rng.randint(32, 128) for _ in range(num_requests)]
    return Workload("long", prompts, output_lens, max_model_len=prompt_len + 256)


def prefix(num_requests: int = 512, seed: int = 0, num_prefixes: int = 8) -> Workload:
    """Shared system prefixes: num_prefixes prefixes of 2048 ids, request i uses prefix
    i % num_prefixes plus its own suffix of randint(64, 256) ids; outputs of randint(64, 256).
    Requests arrive shuffled, as independent users of a few system prompts would."""
    rng = random.Random(seed)
    prefixes = [_ids(rng, 2048) for _ in range(num_prefixes)]
    prompts = [
        prefixes[i % num_prefixes] + _ids(rng, rng.randint(64, 256)) for i in range(num_requests)
    ]
    rng.shuffle(prompts)
    output_lens = [rng.randint(64, 256) for _ in range(num_requests)]
    return Workload("prefix", prompts, output_lens, max_model_len=4096)


# Qwen2.5-Instruct's generation_config (top-k 20, top-p 0.8, repetition penalty 1.05) is the
# base of chat's sampling; clients add the rest.
CHAT_BASE = {"temperature": 0.7, "top_k": 20, "top_p": 0.8}


def _log_normal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return min(high, max(low, round(rng.lognormvariate(math.log(median), sigma))))


def chat_sampling(rng: random.Random, num_requests: int) -> list[dict]:
    """Per request: CHAT_BASE on all; a repetition penalty on a quarter; presence, frequency,
    logprobs and min_tokens each on an eighth (drawn independently)."""
    result = []
    for _ in range(num_requests):
        options = dict(CHAT_BASE)
        if rng.random() < 0.25:
            options["repetition_penalty"] = 1.05
        if rng.random() < 0.125:
            options["presence_penalty"] = 0.5
        if rng.random() < 0.125:
            options["frequency_penalty"] = 0.3
        if rng.random() < 0.125:
            options["logprobs"] = 5
        if rng.random() < 0.125:
            options["min_tokens"] = 16
        result.append(options)
    return result


def chat(num_requests: int = 1000, seed: int = 0) -> Workload:
    """Chat-like requests: log-normal prompt (median 400, 16-3000) and output (median 200,
    8-1000) lengths, and chat_sampling's options."""
    rng = random.Random(seed)
    prompts = [_ids(rng, _log_normal(rng, 400, 0.8, 16, 3000)) for _ in range(num_requests)]
    output_lens = [_log_normal(rng, 200, 0.7, 8, 1000) for _ in range(num_requests)]
    sampling = chat_sampling(rng, num_requests)
    return Workload("chat", prompts, output_lens, max_model_len=4096, sampling=sampling)


def chat_temperature(num_requests: int = 1000, seed: int = 0) -> Workload:
    """chat's requests with temperature 0.7 alone: what a sampling option costs."""
    workload = chat(num_requests, seed)
    sampling = [{"temperature": CHAT_BASE["temperature"]}] * num_requests
    return Workload("chat-temperature", workload.prompts, workload.output_lens,
                    workload.max_model_len, sampling)  # fmt: skip


def headline_qwen3(num_requests: int = 256, seed: int = 0) -> Workload:
    """The headline's requests with Qwen3's generation_config: top-k 20, top-p 0.95."""
    workload = headline(num_requests, seed)
    sampling = [{"temperature": 0.6, "top_k": 20, "top_p": 0.95}] * num_requests
    return Workload("headline-qwen3", workload.prompts, workload.output_lens,
                    workload.max_model_len, sampling)  # fmt: skip


WORKLOADS = {
    "headline": headline,
    "short": short,
    "long": long,
    "prefix": prefix,
    "chat": chat,
    "chat-temperature": chat_temperature,
    "headline-qwen3": headline_qwen3,
}


def shifted(workload: Workload, shift: int) -> Workload:
    """The workload with every prompt id moved by `shift` (mod MAX_TOKEN_ID + 1): the same
    lengths, and prefixes shared within it stay shared, but none with the original. Workloads
    run one after another on one engine take distinct shifts, so that a later one does not find
    an earlier one's prompts in the prefix cache (chat and chat-temperature share prompts)."""
    prompts = [[(t + shift) % (MAX_TOKEN_ID + 1) for t in p] for p in workload.prompts]
    return Workload(workload.name, prompts, workload.output_lens, workload.max_model_len,
                    workload.sampling)  # fmt: skip


def make_workload(name: str, num_requests: int | None = None, seed: int = 0) -> Workload:
    """The named workload; num_requests None: its default count."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {sorted(WORKLOADS)}")
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    factory = WORKLOADS[name]
    return factory(seed=seed) if num_requests is None else factory(num_requests, seed=seed)


def result_fields(workload: Workload, generated: int, seconds: float) -> dict:
    """The counts and rates every throughput JSON line carries."""
    return {
        "workload": workload.name,
        "num_requests": workload.num_requests,
        "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens,
        "generated": generated,
        "seconds": round(seconds, 3),
        "output_tok_s": round(workload.num_output_tokens / seconds, 1),
        # Below output_tok_s where requests end early (a grammar's end, a stop).
        "generated_tok_s": round(generated / seconds, 1),
        "total_tok_s": round(
            (workload.num_prompt_tokens + workload.num_output_tokens) / seconds, 1
        ),
    }


# Batch 1 (bench_latency.py, peer_workload_bench.py latency): a new prompt of this many tokens
# each time (no prefix-cache hits); TPOT over this many greedy tokens after the first.
LATENCY_PROMPT_LEN = 1000
LATENCY_OUTPUT_LEN = 256


@dataclass(frozen=True)
class Batch1Latency:
    ttft_s: list[float]  # one-token generates, each of a new prompt
    full_s: list[float]  # (LATENCY_OUTPUT_LEN + 1)-token generates

    @property
    def ttft(self) -> float:
        return statistics.median(self.ttft_s)

    @property
    def tpot(self) -> float:
        """The time of a later token: a full generate's median less the median TTFT."""
        return (statistics.median(self.full_s) - self.ttft) / LATENCY_OUTPUT_LEN

    def fields(self) -> dict:
        """ttft_ms (median), its quartiles, tpot_ms: the batch-1 JSON fields."""
        quartiles = statistics.quantiles(self.ttft_s, n=4) if len(self.ttft_s) > 1 else []
        return {
            "ttft_ms": round(self.ttft * 1e3, 2),
            "ttft_q1_q3_ms": [round(quartiles[i] * 1e3, 2) for i in (0, 2)] if quartiles else [],
            "tpot_ms": round(self.tpot * 1e3, 3),
        }


def measure_batch1(
    generate: Callable[[list[int], int], object],
    ttft_samples: int = 15,
    full_samples: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> Batch1Latency:
    """Batch-1 latency through generate(prompt_ids, max_tokens), one greedy request that ignores
    EOS. Two full-length 8-token generates warm up first. A TTFT is short and moves with the
    host, so its median takes more samples than the full generates'."""
    if ttft_samples < 1 or full_samples < 1:
        raise ValueError(f"samples must be >= 1, got {ttft_samples} and {full_samples}")
    prompts = iter(random_prompts(2 + ttft_samples + full_samples, LATENCY_PROMPT_LEN, seed=1))

    def timed(max_tokens: int) -> float:
        prompt = next(prompts)
        start = clock()
        generate(prompt, max_tokens)
        return clock() - start

    timed(8)
    timed(8)
    ttft = [timed(1) for _ in range(ttft_samples)]
    return Batch1Latency(ttft, [timed(LATENCY_OUTPUT_LEN + 1) for _ in range(full_samples)])
