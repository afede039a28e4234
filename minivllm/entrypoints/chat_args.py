"""The `minivllm chat` flags (no engine imports, so that `minivllm --help` stays light)."""

from __future__ import annotations

from typing import Any

from minivllm.entrypoints.engine_args import add_engine_options


def add_chat_parser(sub: Any) -> None:
    """Adds the `chat` subcommand (sampling flags as in `generate`, plus every engine option)."""
    chat = sub.add_parser("chat", help="chat with a model in the terminal (streams the reply)")
    chat.add_argument(
        "--model", default=None, help="HF directory or .gguf file (default: the demo model)"
    )
    chat.add_argument("--system", default=None, help="a system message opening the chat")
    chat.add_argument("--max-tokens", type=int, default=256, help="per reply (default: 256)")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0.0)")
    chat.add_argument(
        "--seed-sampling", type=int, default=None, help="sampling seed (default: none)"
    )
    add_engine_options(chat)
