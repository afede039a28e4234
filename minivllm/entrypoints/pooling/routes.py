"""The pooling routes, registered on the server's app by add_pooling_routes (one call):
/v1/embeddings, /v1/rerank and /rerank, /score. They share the app's API-key check, body
limits, error shape and metrics (their requests go through the same engine client)."""

from __future__ import annotations

from functools import cache

from fastapi import FastAPI, Request

from minivllm.entrypoints.openai.params import read_body
from minivllm.entrypoints.pooling.protocol import EmbeddingRequest, RerankRequest, ScoreRequest
from minivllm.entrypoints.pooling.serving_embedding import create_embeddings
from minivllm.entrypoints.pooling.serving_score import create_rerank, create_score
from minivllm.entrypoints.server.serving_common import ServerState
from minivllm.pooling.config import PoolingConfig, load_pooling_config
from minivllm.pooling.rerank import RerankTemplate, load_rerank_template


def add_pooling_routes(app: FastAPI, state: ServerState) -> None:
    """Reads the model's pooling and the reranker's template once, at the first request that
    needs them; a model without one answers its routes with a 400 saying why."""
    limits = state.limits
    embedding = cache(lambda: _pooling_config(state.engine.config.model))
    template = cache(lambda: _rerank_template(state.engine.tokenizer))

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict:
        req = await read_body(request, EmbeddingRequest, limits)
        return await create_embeddings(state, embedding(), req, request.headers.get("x-request-id"))

    async def rerank(request: Request) -> dict:
        req = await read_body(request, RerankRequest, limits)
        return await create_rerank(state, template(), req, request.headers.get("x-request-id"))

    app.post("/v1/rerank")(rerank)
    app.post("/rerank")(rerank)

    @app.post("/score")
    async def score(request: Request) -> dict:
        req = await read_body(request, ScoreRequest, limits)
        return await create_score(state, template(), req, request.headers.get("x-request-id"))


def _pooling_config(model_dir: str) -> PoolingConfig | str:
    try:
        return load_pooling_config(model_dir)
    except ValueError as e:
        return str(e)


def _rerank_template(tokenizer: object) -> RerankTemplate | str:
    try:
        return load_rerank_template(tokenizer)
    except ValueError as e:
        return str(e)
