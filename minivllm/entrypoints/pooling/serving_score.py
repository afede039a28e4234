"""POST /v1/rerank and /rerank (Cohere's and Jina's shape), POST /score (vLLM's): each
(query, document) pair is a prefill-only request through the yes/no reranker's template,
applied here, server-side; a pair's score is its probability of "yes"."""

from __future__ import annotations

import time

from minivllm.entrypoints.openai.params import check_model
from minivllm.entrypoints.pooling.offline import pooling_sampling_params, score_pairs
from minivllm.entrypoints.pooling.protocol import RerankRequest, ScoreRequest
from minivllm.entrypoints.server.errors import APIError
from minivllm.entrypoints.server.serving_common import ServerState, collect, request_ids, submit
from minivllm.outputs import RequestOutput
from minivllm.pooling.rerank import RerankTemplate


async def create_rerank(
    state: ServerState, template: RerankTemplate | str, req: RerankRequest, client_id: str | None
) -> dict:
    """The documents by relevance to the query, highest first, top_n of them."""
    check_model(req.model, state.served_model_names)
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    if not texts:
        raise APIError("documents is empty", param="documents")
    response_id, engine_id = request_ids("rerank", client_id)
    outputs = await _score(
        state, template, [(req.query, t) for t in texts], req.instruction, engine_id
    )
    results = [
        {"index": i, "relevance_score": o.pooled[0]}
        | ({"document": {"text": texts[i]}} if req.return_documents else {})
        for i, o in enumerate(outputs)
    ]
    results.sort(key=lambda r: r["relevance_score"], reverse=True)
    if req.top_n:
        results = results[: req.top_n]
    return {
        "id": response_id,
        "model": state.model_name,
        "usage": _usage(outputs),
        "results": results,
    }


async def create_score(
    state: ServerState, template: RerankTemplate | str, req: ScoreRequest, client_id: str | None
) -> dict:
    """One score per pair, in the second texts' order."""
    check_model(req.model, state.served_model_names)
    first, second = req.text_1, req.text_2
    names = ("text_1", "text_2")
    if req.queries is not None or req.documents is not None:
        if first is not None or second is not None:
            raise APIError("give text_1 and text_2, or queries and documents", param="queries")
        first, second, names = req.queries, req.documents, ("queries", "documents")
    for name, value in zip(names, (first, second)):
        if value is None:
            raise APIError(f"{name} is missing", param=name)
    try:
        pairs = score_pairs(first, second)
    except ValueError as e:
        raise APIError(str(e), param=names[1]) from None
    response_id, engine_id = request_ids("score", client_id)
    outputs = await _score(state, template, pairs, req.instruction, engine_id)
    data = [{"index": i, "object": "score", "score": o.pooled[0]} for i, o in enumerate(outputs)]
    return {
        "id": response_id,
        "object": "list",
        "created": int(time.time()),
        "model": state.model_name,
        "data": data,
        "usage": _usage(outputs),
    }


async def _score(
    state: ServerState,
    template: RerankTemplate | str,
    pairs: list[tuple[str, str]],
    instruction: str | None,
    engine_id: str,
) -> list[RequestOutput]:
    if isinstance(template, str):
        raise APIError(f"this model cannot rerank: {template}", param="model")
    limit = state.limits.max_prompts_per_request
    if len(pairs) > limit:
        raise APIError(
            f"{len(pairs)} documents; at most {limit} per request (--max-prompts-per-request)",
            param="documents",
        )
    engine = state.engine
    params = pooling_sampling_params(template.params)
    prompts = []
    for query, document in pairs:
        ids = await engine.async_tokenizer.run(
            template.prompt_ids, engine.tokenizer, query, document, instruction
        )
        prompts.append((None, ids, params))
    try:
        return await collect(await submit(state, engine_id, prompts))
    except APIError as e:  # a pair the engine refuses (too long)
        raise APIError(e.message, e.status, e.param or "documents", e.headers) from None


def _usage(outputs: list[RequestOutput]) -> dict:
    num_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
