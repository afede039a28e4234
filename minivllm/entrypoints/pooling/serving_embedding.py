"""POST /v1/embeddings: OpenAI's shape. Each input is a prefill-only pooling request;
the vectors come back as floats or as base64 of little-endian float32 (encoding_format)."""

from __future__ import annotations

import base64
import time

import numpy as np

from minivllm.entrypoints.openai.params import check_model
from minivllm.entrypoints.pooling.offline import pooling_sampling_params
from minivllm.entrypoints.pooling.protocol import EmbeddingRequest
from minivllm.entrypoints.server.errors import APIError
from minivllm.entrypoints.server.serving_common import (
    ServerState,
    collect,
    request_ids,
    submit,
    tokenize_text,
)
from minivllm.pooling.config import PoolingConfig
from minivllm.sampling_params import SamplingParams


async def create_embeddings(
    state: ServerState, config: PoolingConfig | str, req: EmbeddingRequest, client_id: str | None
) -> dict:
    """config: the model's pooling, or why it has none (a 400)."""
    check_model(req.model, state.served_model_names)
    if isinstance(config, str):
        raise APIError(f"this model cannot embed: {config}", param="model")
    try:
        params = pooling_sampling_params(config.embed_params(req.dimensions))
    except ValueError as e:
        raise APIError(str(e), param="dimensions") from None
    prompts = await _prompts(state, req.input, params)
    response_id, engine_id = request_ids("embd", client_id)
    try:
        outputs = await collect(await submit(state, engine_id, prompts))
    except APIError as e:  # a prompt the engine refuses (empty, too long, an id out of range)
        raise APIError(e.message, e.status, e.param or "input", e.headers) from None
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(o.pooled, req.encoding_format)}
        for i, o in enumerate(outputs)
    ]
    num_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {
        "id": response_id,
        "object": "list",
        "created": int(time.time()),
        "model": state.model_name,
        "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


async def _prompts(
    state: ServerState, inputs: object, params: SamplingParams
) -> list[tuple[str | None, list[int], SamplingParams]]:
    """(text, token ids, params) of each input; 400s naming input for none or too many."""
    if isinstance(inputs, str):
        inputs = [inputs]
    elif inputs and isinstance(inputs[0], int):
        inputs = [inputs]  # one prompt of token ids
    if not inputs:
        raise APIError("input is empty: give a text, token ids or a list of them", param="input")
    limit = state.limits.max_prompts_per_request
    if len(inputs) > limit:
        raise APIError(
            f"input has {len(inputs)} items; at most {limit} per request "
            "(--max-prompts-per-request)",
            param="input",
        )
    prompts = []
    for item in inputs:
        if isinstance(item, str):
            ids = await tokenize_text(state.engine, item, True, param="input")
            prompts.append((item, ids, params))
        else:
            prompts.append((None, list(item), params))
    return prompts


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
