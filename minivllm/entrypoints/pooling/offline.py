"""LLM.embed and LLM.score: pooling requests through LLM.generate, results shaped as vLLM's.

LLM(model, task="embed" | "score") (vLLM's task names) reads the model's pooling once
(load_task); a pooling request is SamplingParams(max_tokens=1, pooling=...), prefill-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from minivllm.pooling.config import PoolingConfig, load_pooling_config
from minivllm.pooling.outputs import (
    EmbeddingOutput,
    EmbeddingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from minivllm.pooling.params import PoolingParams
from minivllm.pooling.rerank import RerankTemplate, load_rerank_template
from minivllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minivllm.entrypoints.llm import LLM

TASKS = ("generate", "embed", "score")


def load_task(task: str, model_dir: str, tokenizer: Any) -> PoolingConfig | RerankTemplate | None:
    """What a task needs from the model's files: the pooling (embed), the reranker's
    template (score), nothing (generate). ValueError naming task for another value."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task == "embed":
        return load_pooling_config(model_dir)
    if task == "score":
        return load_rerank_template(tokenizer)
    return None


def pooling_sampling_params(params: PoolingParams) -> SamplingParams:
    """A pooling request's SamplingParams: one greedy token, which ends it."""
    return SamplingParams(max_tokens=1, temperature=0.0, pooling=params)


def embed(
    llm: LLM, prompts: Any, dimensions: int | None = None, use_tqdm: bool = True
) -> list[EmbeddingRequestOutput]:
    """One embedding per prompt (a text, token ids, or a list of them), in order."""
    config = llm.pooling
    if not isinstance(config, PoolingConfig):
        raise ValueError(f"LLM.embed needs LLM(..., task='embed'), this one has task={llm.task!r}")
    params = pooling_sampling_params(config.embed_params(dimensions))
    outputs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    return [
        EmbeddingRequestOutput(o.request_id, o.prompt_token_ids, EmbeddingOutput(o.pooled))
        for o in outputs
    ]


def score(
    llm: LLM,
    query: str | Sequence[str],
    documents: str | Sequence[str],
    instruction: str | None = None,
    use_tqdm: bool = True,
) -> list[ScoringRequestOutput]:
    """The relevance of each document to the query (one query for all documents, or one
    query per document), in [0, 1], in the documents' order."""
    template = llm.pooling
    if not isinstance(template, RerankTemplate):
        raise ValueError(f"LLM.score needs LLM(..., task='score'), this one has task={llm.task!r}")
    pairs = score_pairs(query, documents)
    prompts = [
        {"prompt_token_ids": template.prompt_ids(llm.tokenizer, q, d, instruction)}
        for q, d in pairs
    ]
    outputs = llm.generate(prompts, pooling_sampling_params(template.params), use_tqdm=use_tqdm)
    return [
        ScoringRequestOutput(o.request_id, o.prompt_token_ids, ScoringOutput(o.pooled[0]))
        for o in outputs
    ]


def score_pairs(
    query: str | Sequence[str], documents: str | Sequence[str]
) -> list[tuple[str, str]]:
    """(query, document) pairs: one query against every document, or pairwise."""
    queries = [query] if isinstance(query, str) else list(query)
    docs = [documents] if isinstance(documents, str) else list(documents)
    if not docs:
        raise ValueError("documents is empty")
    if not all(isinstance(x, str) for x in (*queries, *docs)):
        raise TypeError("query and documents must be strings or lists of strings")
    if len(queries) == 1:
        queries = queries * len(docs)
    if len(queries) != len(docs):
        raise ValueError(
            f"got {len(queries)} queries for {len(docs)} documents: give one or one per document"
        )
    return list(zip(queries, docs))
