"""Embedding throughput and reranking latency on the GPU, beside vLLM's pooling runner.

Embeddings: many short texts (random token ids of 16-512 tokens, Qwen3-Embedding-0.6B's shape
with dummy weights: last-token pooling, normalised, as sentence-transformers' files say),
texts/s after one warm-up pass. Reranking: one query prefix shared by N documents, each
scored by its last position's yes/no logits; the latency of one call, median of several.
With --vllm the same inputs go through vLLM's LLM(runner="pooling") (embed, and classify over
the Qwen3-Reranker conversion) in this process, after ours. One JSON line.

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
    args = parser.parse_args()
    require_cuda("bench_embed.py", "a 0.6B-shape model over 10,000 texts")
    model_dir = embedding_model_dir()
    vocab_size = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    texts, docs = workloads(args, vocab_size)
    result = {"bench": "embed", "shape": MODEL_SHAPE, **{k: v for k, v in vars(args).items()}}
    result["minivllm"] = run_minivllm(model_dir, texts, docs, args.rounds)
    if args.vllm:
        result["vllm"] = {}
        try:
            run_vllm(model_dir, texts, docs, args.rounds, result["vllm"])
        except Exception as e:  # noqa: BLE001 - our figures are printed whatever vLLM does
            result["vllm"]["error"] = f"{type(e).__name__}: {e}"[:500]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
