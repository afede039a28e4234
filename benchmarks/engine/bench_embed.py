"""Embedding throughput and reranking latency on the GPU, beside vLLM's pooling runner.

Embeddings: many short texts (random token ids of 16-512 tokens, Qwen3-Embedding-0.6B's shape
with dummy weights: last-token pooling, normalised, as sentence-transformers' files say),
texts/s after one warm-up pass. Reranking: one query prefix shared by N documents, each
scored by its last position's yes/no logits; the latency of one call, median of several.
With --vllm the same inputs go through vLLM's LLM(runner="pooling") (embed, and classify over
the Qwen3-Reranker conversion) after ours. Each engine runs in a child process of its own (one
engine's GPU memory is gone before the next starts), vLLM's under --vllm-timeout. One JSON line.

  python -m benchmarks.engine.bench_embed [--num-texts 10000] [--num-docs 100] [--vllm]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks.common import dummy_model_dir, require_cuda
from minivllm.tiny_model import write_sentence_transformers_files

MODEL_SHAPE = "qwen3-0.6b"  # Qwen3-Embedding-0.6B and Qwen3-Reranker-0.6B share it


def embedding_model_dir() -> str:
    """The dummy Qwen3-0.6B directory plus sentence-transformers' files (last, normalised)."""
    out = dummy_model_dir(MODEL_SHAPE) + "-embed"
    if not os.path.isdir(out):
        shutil.copytree(dummy_model_dir(MODEL_SHAPE), out)
    write_sentence_transformers_files(out, "last", True)
    return out


def workloads(args: argparse.Namespace, vocab_size: int) -> tuple[list, list]:
    rng = random.Random(args.seed)
    texts = [
        [rng.randrange(1000, vocab_size) for _ in range(rng.randint(args.min_len, args.max_len))]
        for _ in range(args.num_texts)
    ]
    query = [rng.randrange(1000, vocab_size) for _ in range(args.query_len)]
    docs = [
        query + [rng.randrange(1000, vocab_size) for _ in range(rng.randint(64, args.doc_len))]
        for _ in range(args.num_docs)
    ]
    return texts, docs


def run_minivllm(model_dir: str, texts: list, docs: list, rounds: int) -> dict:
    from minivllm import LLM
    from minivllm.entrypoints.pooling.offline import pooling_sampling_params
    from minivllm.pooling.params import PoolingParams

    llm = LLM(model_dir, task="embed", load_format="dummy")
    prompts = [{"prompt_token_ids": t} for t in texts]
    llm.embed(prompts[:256], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.embed(prompts, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert len(outputs[0].outputs.embedding) > 0
    # The reranker's work: the last position's logits of two answer tokens (ids 0 and 1).
    params = pooling_sampling_params(PoolingParams("score", "last", False, None, (0, 1)))
    doc_prompts = [{"prompt_token_ids": d} for d in docs]
    latencies = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        llm.generate(doc_prompts, params, use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    llm.shutdown()
    return _figures(len(texts), elapsed, latencies[1:])


def run_vllm(model_dir: str, texts: list, docs: list, rounds: int, result: dict) -> None:
    """vLLM's figures into result as they come (an embed figure survives a rerank failure)."""
    from vllm import LLM, TokensPrompt

    llm = LLM(model_dir, runner="pooling", load_format="dummy")
    prompts = [TokensPrompt(prompt_token_ids=t) for t in texts]
    llm.embed(prompts[:256], use_tqdm=False)
    start = time.perf_counter()
    llm.embed(prompts, use_tqdm=False)
    elapsed = time.perf_counter() - start
    result.update(_figures(len(texts), elapsed, [float("nan")]))
    del llm
    gc.collect()
    # Qwen3-Reranker as vLLM runs it: a sequence classifier over two answer tokens.
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": ["t0", "t1"],
        "is_original_qwen3_reranker": True,
    }
    llm = LLM(model_dir, runner="pooling", load_format="dummy", hf_overrides=overrides)
    doc_prompts = [TokensPrompt(prompt_token_ids=d) for d in docs]
    latencies = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        llm.classify(doc_prompts, use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    result.update(_figures(len(texts), elapsed, latencies[1:]))


def _figures(num_texts: int, elapsed: float, latencies: list[float]) -> dict:
    return {
        "embed_texts_per_s": round(num_texts / elapsed, 1),
        "embed_s": round(elapsed, 3),
        "rerank_ms_median": round(1000 * statistics.median(latencies), 2),
        "rerank_ms_min": round(1000 * min(latencies), 2),
    }


def run_child(args: argparse.Namespace, engine: str, timeout: float | None) -> dict:
    """One engine's figures from a child process (this module with --engine ENGINE)."""
    argv = [sys.executable, "-m", __spec__.name, "--engine", engine]
    for name in ("num_texts", "min_len", "max_len", "num_docs", "query_len", "doc_len",
                 "rounds", "seed"):  # fmt: skip
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within --vllm-timeout {timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-500:]}"}
    return json.loads(lines[-1])


def run_one(args: argparse.Namespace) -> dict:
    """This process's engine (--engine) over the seeded inputs."""
    model_dir = embedding_model_dir()
    vocab_size = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    texts, docs = workloads(args, vocab_size)
    if args.engine == "minivllm":
        return run_minivllm(model_dir, texts, docs, args.rounds)
    result: dict = {}
    try:
        run_vllm(model_dir, texts, docs, args.rounds, result)
    except Exception as e:  # noqa: BLE001 - the figures so far are printed whatever vLLM does
        result["error"] = f"{type(e).__name__}: {e}"[:500]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-texts", type=int, default=10000)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--num-docs", type=int, default=100)
    parser.add_argument("--query-len", type=int, default=64)
    parser.add_argument("--doc-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm", action="store_true", help="also vLLM's pooling runner")
    parser.add_argument("--vllm-timeout", type=float, default=600.0,
                        help="seconds vLLM's child process may take (default 600)")  # fmt: skip
    parser.add_argument("--engine", choices=["minivllm", "vllm"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    require_cuda("bench_embed.py", "a 0.6B-shape model over 10,000 texts")
    if args.engine:  # a child: one engine, its figures alone
        print(json.dumps(run_one(args)))
        return
    embedding_model_dir()  # written once, before the children read it
    result = {"bench": "embed", "shape": MODEL_SHAPE, **vars(args)}
    del result["engine"]
    result["minivllm"] = run_child(args, "minivllm", None)
    if args.vllm:
        result["vllm"] = run_child(args, "vllm", args.vllm_timeout)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
