"""`minivllm serve`: builds the engine and the app, runs uvicorn, shuts down cleanly."""

from __future__ import annotations

import argparse
import logging
import os
import signal

from minivllm.config import EngineConfig
from minivllm.entrypoints.async_llm import AsyncLLM
from minivllm.entrypoints.engine_args import engine_options
from minivllm.entrypoints.openai.http_server import build_server
from minivllm.entrypoints.openai.metrics import ServerMetrics
from minivllm.entrypoints.openai.protocol import ServerLimits
from minivllm.entrypoints.openai.server import build_app
from minivllm.entrypoints.openai.serving_common import ServerState

logger = logging.getLogger("minivllm.serve")
API_KEY_ENV = "MINIVLLM_API_KEY"


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file (read once, at startup) or the template text itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value) as f:
            return f.read()
    if "{" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")


def run_serve(args: argparse.Namespace) -> int:
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    options = engine_options(args)
    config = EngineConfig.from_options(args.model, usage_context="server", **options)
    chat_template = load_chat_template(args.chat_template)
    limits = ServerLimits(  # a bad limit fails here, before the engine is built
        args.max_request_body_bytes, args.timeout_request_read, args.max_prompts_per_request
    )
    names = args.served_model_name or [args.model]
    metrics = ServerMetrics(names[0])
    engine = AsyncLLM(config, args.generation_config, observer=metrics)
    try:
        state = ServerState(engine, names, chat_template, not args.disable_log_requests, limits)
        app = build_app(state, metrics, api_key)
        server = build_server(
            app,
            engine,
            args.host,
            args.port,
            not args.disable_uvicorn_access_log,
            args.timeout_graceful_shutdown,
            args.timeout_request_read,
        )
        # uvicorn handles SIGINT/SIGTERM while it runs, then re-raises the signal to the
        # handler it found: a no-op one lets the process return 0 after a clean shutdown.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        logger.info("serving %s on http://%s:%d", names[0], args.host, args.port)
        server.run()
    finally:
        engine.shutdown()
    return 0
