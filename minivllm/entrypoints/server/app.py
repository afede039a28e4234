"""The FastAPI app: routes, API-key check, body-size limit, OpenAI-shaped errors,
client-disconnect aborts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import time
from collections.abc import Awaitable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from minivllm.entrypoints.anthropic.protocol import CountTokensRequest, MessagesRequest
from minivllm.entrypoints.anthropic.serving import (
    anthropic_error,
    count_tokens,
    create_message,
)
from minivllm.entrypoints.async_llm import AsyncLLM
from minivllm.entrypoints.openai.chat.template import render_chat
from minivllm.entrypoints.openai.params import check_model, check_unimplemented, read_body
from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from minivllm.entrypoints.openai.serving_chat import create_chat_completion
from minivllm.entrypoints.openai.serving_completion import create_completion
from minivllm.entrypoints.pooling.routes import add_pooling_routes
from minivllm.entrypoints.responses.protocol import ResponsesRequest
from minivllm.entrypoints.responses.serving import (
    create_response,
    delete_response,
    get_response,
)
from minivllm.entrypoints.server.errors import APIError, error_json
from minivllm.entrypoints.server.metrics import ServerMetrics
from minivllm.entrypoints.server.path_errors import error_for_path
from minivllm.entrypoints.server.serving_common import ServerState, tokenize_text

logger = logging.getLogger("minivllm.serve")
VERSION = "0.1.0"
# Paths any client may read without the API key (as in vLLM): probes and scrapers
# (vllm-router polls /get_load without credentials).
_OPEN_PATHS = frozenset({"/health", "/metrics", "/get_load"})


def build_app(state: ServerState, metrics: ServerMetrics, api_key: str | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.attach_loop(asyncio.get_running_loop())
        # Startup's objects (modules, tokenizer, app) are permanent: keep the collector from
        # re-scanning them while every streamed token allocates a few small objects.
        gc.collect()
        gc.freeze()
        yield
        # After uvicorn's graceful phase: fail whatever is still open, stop the core.
        state.engine.shutdown()

    app = FastAPI(title="minivllm", version=VERSION, lifespan=lifespan)
    _add_error_handlers(app)
    if api_key is not None:
        _add_api_key_check(app, api_key)
    app.add_middleware(_BodySizeLimit, max_bytes=state.limits.max_body_bytes)  # outermost
    _add_info_routes(app, state, metrics)
    _add_generation_routes(app, state)
    add_pooling_routes(app, state)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        response = error_for_path(request.url.path, e.message, e.status, e.param)
        response.headers.update(e.headers)
        if e.status == 408:  # the body never came: the connection can carry nothing more
            response.headers["connection"] = "close"
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return error_for_path(request.url.path, f"invalid request: {e.errors()[:3]}", 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_for_path(request.url.path, str(e.detail), e.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_for_path(request.url.path, f"internal error: {type(e).__name__}", 500)


def _add_api_key_check(app: FastAPI, api_key: str) -> None:
    app.add_middleware(_APIKeyCheck, key=api_key.encode())


class _APIKeyCheck:
    """Pure ASGI middleware (Starlette's BaseHTTPMiddleware would re-buffer every stream
    chunk). As in vLLM every path is protected (/v1/*, /tokenize, /detokenize, /version,
    /docs, /openapi.json, /redoc) but /health, /metrics (and our /get_load). The key comes
    as `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's)."""

    def __init__(self, app, key: bytes) -> None:
        self.app = app
        self.bearer = b"Bearer " + key
        self.key = key

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] not in _OPEN_PATHS
            and scope["method"] != "OPTIONS"
        ):
            headers = dict(scope["headers"])
            # Constant time: the comparison does not reveal how much of the key matched.
            bearer = hmac.compare_digest(headers.get(b"authorization", b""), self.bearer)
            if not (bearer | hmac.compare_digest(headers.get(b"x-api-key", b""), self.key)):
                response = error_for_path(
                    scope["path"], "Unauthorized: missing or wrong API key", 401
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BodySizeLimit:
    """A 413 for a Content-Length above max_bytes, sent before the body is read (read_body
    also stops a chunked body at max_bytes)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"0")
            if length.isdigit() and int(length) > self.max_bytes:
                response = error_for_path(
                    scope["path"],
                    f"the request body ({int(length)} bytes) is larger than {self.max_bytes} "
                    "bytes (--max-request-body-bytes)",
                    413,
                )
                # No "connection: close": uvicorn reads and drops the body (closing now would
                # reset the connection under a client still sending it, who would never see
                # this 413); the next head's deadline bounds how long that may take.
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _add_info_routes(app: FastAPI, state: ServerState, metrics: ServerMetrics) -> None:
    created = int(time.time())

    @app.get("/health")
    async def health() -> Response:
        engine = state.engine
        if engine.is_dead:
            return error_json(f"engine dead: {engine.dead_reason}", 503)
        if engine.is_stalled:  # stopped or wedged with work queued (docs/serving.md)
            return error_json(
                f"engine stalled: no progress for {engine.stalled_for():.1f} s with "
                f"{engine.num_open_requests} request(s) open (MINIVLLM_ENGINE_ITERATION_TIMEOUT_S "
                f"= {engine.iteration_timeout_s:g} s)",
                503,
            )
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": VERSION}

    @app.get("/get_load")
    async def get_load() -> dict:
        # vllm-router's power_of_two polls this and reads "load" (docs/serving.md, Replicas).
        return {"load": state.engine.num_open_requests}

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        cards = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "minivllm",
                "root": state.engine.config.model,
                "parent": None,
                "max_model_len": state.engine.max_model_len,
                "permission": [],
            }
            for name in state.served_model_names
        ]
        return {"object": "list", "data": cards}

    limits = state.limits
    engine = state.engine

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        req = await read_body(request, TokenizeRequest, limits)
        check_model(req.model, state.served_model_names)
        check_unimplemented(req)
        tokenizer = state.engine.tokenizer
        if req.chat_template is not None:
            raise APIError("chat_template in a request is not accepted", param="chat_template")
        if (req.messages is None) == (req.prompt is None):
            raise APIError("give either prompt or messages", param="prompt")
        if req.messages is not None:
            tokens = await render_chat(
                state.engine,
                state.chat_template,
                req.messages,
                req.tools,
                req.chat_template_kwargs,
                req.add_generation_prompt,
                req.continue_final_message,
                bool(req.add_special_tokens),
            )
        else:
            if req.tools is not None:
                raise APIError("tools go with messages, not a prompt", param="tools")
            add_special = req.add_special_tokens is not False
            tokens = await tokenize_text(state.engine, req.prompt, add_special)
        strs = None
        if req.return_token_strs:
            strs = await engine.async_tokenizer.run(tokenizer.convert_ids_to_tokens, tokens)
        return {
            "count": len(tokens),
            "max_model_len": state.engine.max_model_len,
            "tokens": tokens,
            "token_strs": strs,
        }

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        req = await read_body(request, DetokenizeRequest, limits)
        check_model(req.model, state.served_model_names)
        # A million ids take ~2 s to check and decode: on a tokenizer thread, not the loop.
        text = await engine.async_tokenizer.run(_decode_checked, engine, req.tokens)
        if text is None:
            raise APIError(f"token ids must be in [0, {engine.info.vocab_size})", param="tokens")
        return {"prompt": text}


def _decode_checked(engine: AsyncLLM, token_ids: list[int]) -> str | None:
    """The text of token_ids, or None if one is outside the vocabulary."""
    vocab_size = engine.info.vocab_size
    if any(not 0 <= t < vocab_size for t in token_ids):
        return None
    return engine.tokenizer.decode(token_ids)


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    limits = state.limits

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await read_body(request, CompletionRequest, limits)
        header_id = request.headers.get("x-request-id")
        return await _until_disconnect(request, create_completion(state, req, header_id))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await read_body(request, ChatCompletionRequest, limits)
        header_id = request.headers.get("x-request-id")
        return await _until_disconnect(request, create_chat_completion(state, req, header_id))

    @app.post("/v1/messages")
    async def anthropic_messages(request: Request) -> Response:
        try:
            req = await read_body(request, MessagesRequest, limits)
            return await _until_disconnect(request, create_message(state, req))
        except APIError as e:  # Anthropic's clients read Anthropic's error shape
            return anthropic_error(e)

    @app.post("/v1/messages/count_tokens")
    async def anthropic_count_tokens(request: Request) -> Response:
        try:
            req = await read_body(request, CountTokensRequest, limits)
            return JSONResponse(await count_tokens(state, req))
        except APIError as e:
            return anthropic_error(e)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        req = await read_body(request, ResponsesRequest, limits)
        return await _until_disconnect(request, create_response(state, req))

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str, request: Request) -> dict:
        if request.query_params:  # stream / starting_after replay a background response's events
            raise APIError(f"query parameters {sorted(request.query_params)} are not supported")
        return get_response(state, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def forget_response(response_id: str) -> dict:
        return delete_response(state, response_id)


async def _until_disconnect(request: Request, handler: Awaitable[Response]) -> Response:
    """Runs handler until it returns or the client disconnects; then it is cancelled, which
    aborts its engine requests. (A streaming response watches for disconnects itself.)"""
    task = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()  # the generators' finally blocks abort the engine requests
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return Response(status_code=499)  # nobody reads it: the client is gone


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
