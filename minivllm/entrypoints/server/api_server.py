"""`minivllm serve`: checks its options, builds the engine and the app, runs uvicorn, shuts
down cleanly; exits 1 when the engine core dies (for a supervisor to restart it)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

from minivllm.config import EngineConfig
from minivllm.cpu_threads import set_torch_threads
from minivllm.demo_model import default_model, default_model_name
from minivllm.entrypoints.async_llm import AsyncLLM
from minivllm.entrypoints.engine_args import engine_options
from minivllm.entrypoints.openai.protocol import ServerLimits
from minivllm.entrypoints.server.app import build_app
from minivllm.entrypoints.server.http_server import build_server
from minivllm.entrypoints.server.metrics import ServerMetrics
from minivllm.entrypoints.server.response_store import ResponseStore
from minivllm.entrypoints.server.serving_common import ServerState

logger = logging.getLogger("minivllm.serve")
API_KEY_ENV = "MINIVLLM_API_KEY"
# vLLM's VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: "1" keeps the server up (answering 503) after the
# engine core dies, instead of exiting 1.
KEEP_ALIVE_ENV = "MINIVLLM_KEEP_ALIVE_ON_ENGINE_DEATH"
EXIT_ENGINE_DEAD = 1


def check_port_free(host: str, port: int) -> None:
    """Binds (host, port) as uvicorn will (SO_REUSEADDR), then lets go: a port in use is an
    error before the model loads, not after."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror} (--host, --port)") from e


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
    model, default_name = args.model, None
    if model is None:
        model, notice = default_model()
        default_name = default_model_name(model)
        print(f"{notice}; served as {default_name!r}", file=sys.stderr)
    # Every option is checked before the model loads (that takes seconds to minutes).
    options = engine_options(args)
    config = EngineConfig.from_options(model, usage_context="server", **options)
    chat_template = load_chat_template(args.chat_template)
    limits = ServerLimits(
        args.max_request_body_bytes, args.timeout_request_read, args.max_prompts_per_request
    )
    response_store = ResponseStore(args.responses_store_bytes)
    check_port_free(args.host, args.port)
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (as in vLLM)")
    names = args.served_model_name or [default_name or model]
    metrics = ServerMetrics(names[0])
    keep_alive = os.environ.get(KEEP_ALIVE_ENV, "0") == "1"
    set_torch_threads("frontend")  # HTTP and text: the cores go to the engine's process
    engine = AsyncLLM(config, args.generation_config, observer=metrics)
    try:
        state = ServerState(
            engine,
            names,
            chat_template,
            not args.disable_log_requests,
            limits,
            tool_parser=args.tool_call_parser if args.enable_auto_tool_choice else None,
            reasoning_parser=args.reasoning_parser,
            response_store=response_store,
        )
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
        if not keep_alive:
            # Open requests are failed first (503s, error chunks), then uvicorn's graceful
            # shutdown lets those answers go out.
            engine.on_dead = lambda: setattr(server, "should_exit", True)
        logger.info("serving %s on http://%s:%d", names[0], args.host, args.port)
        server.run()
    finally:
        engine.shutdown()
    return _exit_code(engine, keep_alive)


def _exit_code(engine: AsyncLLM, keep_alive: bool) -> int:
    """0 after a clean shutdown; EXIT_ENGINE_DEAD if the engine core died under us."""
    if not engine.core_failed or keep_alive:
        return 0
    logger.error(
        "the engine core died (%s): exiting %d (%s=1 keeps the server up)",
        engine.dead_reason,
        EXIT_ENGINE_DEAD,
        KEEP_ALIVE_ENV,
    )
    return EXIT_ENGINE_DEAD
