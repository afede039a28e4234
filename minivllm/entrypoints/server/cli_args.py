"""The `minivllm serve` flags (no server imports, so that `minivllm --help` stays light)."""

from __future__ import annotations

import argparse

from minivllm.entrypoints.engine_args import add_engine_options
from minivllm.entrypoints.parsers.reasoning import REASONING_PARSERS
from minivllm.entrypoints.parsers.tools import TOOL_PARSERS


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    serve = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    serve.add_argument(
        "model",
        nargs="?",
        default=None,
        help="HF checkpoint directory or .gguf file (default: the demo model, as `generate`)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    serve.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) clients use in `model` (default: the model path); the first is reported",
    )
    serve.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every path but "
        "/health, /metrics and /get_load (or set MINIVLLM_API_KEY)",
    )
    serve.add_argument(
        "--chat-template", default=None, help="a Jinja chat template: a file path or the text"
    )
    serve.add_argument(
        "--generation-config",
        default="auto",
        help="sampling defaults: auto (the model's generation_config.json), vllm (none), "
        "or a directory holding a generation_config.json",
    )
    serve.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no log line per request (its id, prompt tokens and sampling parameters)",
    )
    serve.add_argument(
        "--disable-uvicorn-access-log",
        action="store_true",
        help="no uvicorn access-log line per HTTP request",
    )
    serve.add_argument(
        "--timeout-graceful-shutdown",
        type=float,
        default=10.0,
        help="seconds open requests get to finish after SIGINT/SIGTERM before they are failed",
    )
    serve.add_argument(
        "--timeout-request-read",
        type=float,
        default=30.0,
        help="seconds a request's head, then its body, may take to arrive (408 after)",
    )
    serve.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=8 << 20,
        help="largest request body (413 above, decided from Content-Length; default 8 MiB)",
    )
    serve.add_argument(
        "--max-prompts-per-request",
        type=int,
        default=1024,
        help="most completions (prompts x n) one request may ask for (400 above)",
    )
    serve.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='parse tool calls out of the text for tool_choice "auto" (needs --tool-call-parser)',
    )
    serve.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS),
        default=None,
        help="the model's tool-call format (hermes: <tool_call>{json}</tool_call>, Qwen2.5/3; "
        'llama3_json: {"name": ..., "parameters": ...} after an optional <|python_tag|>, '
        "Llama 3.x), both also taking a bare JSON call; qwen3_coder (or qwen3_xml): "
        "<tool_call><function=NAME><parameter=KEY>value</parameter></function></tool_call>, "
        "Qwen3-Coder and Qwen3.5/3.6, values typed by the tool's schema",
    )
    serve.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS),
        default=None,
        help="split <think>...</think> into message.reasoning (and reasoning_content)",
    )
    serve.add_argument(
        "--responses-store-bytes",
        type=int,
        default=64 << 20,
        help="memory for the Responses API's stored answers (store: true; for "
        "previous_response_id), counted as the bytes of their JSON text, which is how they "
        "are kept; least recently used dropped past it; an answer larger than all of it is "
        'answered with "store": false; 0 stores none (default 64 MiB)',
    )
    add_engine_options(serve)
    return serve
