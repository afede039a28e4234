"""The `minivllm` command: `generate` (offline generation), `chat` and `bench` (benchmarks)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from minivllm.config import EngineConfig
from minivllm.demo_model import default_model
from minivllm.entrypoints.chat_args import add_chat_parser
from minivllm.entrypoints.engine_args import add_engine_options, engine_options
from minivllm.entrypoints.server.cli_args import add_serve_parser
from minivllm.sampling_params import SamplingParams

# The engine (torch, seconds to import) is imported by the commands that run it, not at the
# top: `minivllm --help` and a bad option answer at once.


def run_generate(args: argparse.Namespace) -> int:
    # Every option is checked before the model loads (that takes seconds to minutes).
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed_sampling
    )
    model = args.model
    if model is None:
        model, notice = default_model()
        print(notice, file=sys.stderr)
    from minivllm.entrypoints.llm import LLM

    llm = LLM(model, **engine_options(args))  # checks the engine options first
    prompts = args.prompt or ["Hello, my name is", "The capital of France is"]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.no_progress)
    elapsed = time.perf_counter() - start
    for out in outputs:
        print(
            json.dumps(
                {
                    "prompt": out.prompt,
                    "text": out.outputs[0].text,
                    "num_tokens": len(out.outputs[0].token_ids),
                    "finish_reason": out.outputs[0].finish_reason,
                }
            )
        )
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"[minivllm] {num_tokens} tokens in {elapsed:.2f} s", file=sys.stderr)
    llm.shutdown()
    return 0


def run_headless_node(args: argparse.Namespace) -> int:
    """`minivllm serve MODEL --headless ...`: this node's ranks of node 0's engine."""
    model = args.model
    if model is None:
        model, notice = default_model()
        print(notice, file=sys.stderr)
    config = EngineConfig.from_options(model, usage_context="server", **engine_options(args))
    from minivllm.engine.executor.node_worker import run_headless

    return run_headless(config)


# The `server` extra's modules: a serve without them says which extra to install.
SERVER_EXTRA_MODULES = ("fastapi", "uvicorn", "starlette", "pydantic", "prometheus_client")


def run_serve_checked(args: argparse.Namespace) -> int:
    try:
        # fastapi and uvicorn are optional (the `server` extra): imported only to serve.
        from minivllm.entrypoints.server.api_server import run_serve
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] not in SERVER_EXTRA_MODULES:
            raise
        print(
            f"minivllm: error: `minivllm serve` needs the server extra ({e.name} is not "
            "installed): pip install -e '.[server]' in a source checkout",
            file=sys.stderr,
        )
        return 2
    exit_code = run_serve(args)
    # The server has stopped and its engine with it: skip the interpreter's finalization,
    # which only prints triton's nanobind "leaked" warnings (dozens of lines at every stop).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def run_bench(args: argparse.Namespace) -> int:
    """Runs the source checkout's benchmarks.engine.bench_<kind> module with the remaining
    arguments, as `python -m` from the checkout's root would (the root first on sys.path: the
    benchmarks import their shared modules as `benchmarks.*`) and `minivllm bench <kind>` as
    its argv[0] (its --help and errors name the command that was typed)."""
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    module = f"benchmarks.engine.bench_{args.kind}"
    if not (root / "benchmarks" / "engine" / f"bench_{args.kind}.py").is_file():
        raise ValueError(f"benchmark {module} not found under {root} (needs a source checkout)")
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [f"minivllm bench {args.kind}", *args.rest]
    sys.path.insert(0, str(root))
    try:
        # alter_sys=False keeps the argv[0] above (run_module would set the module's path).
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as e:  # argparse's --help and errors, the script's own exit codes
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `minivllm` command line: generate, serve, chat, bench."""
    parser = argparse.ArgumentParser(prog="minivllm")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text offline")
    gen.add_argument(
        "--model", default=None, help="HF directory or .gguf file (default: the demo model)"
    )
    gen.add_argument(
        "--prompt",
        action="append",
        help="a prompt (repeatable; default: two built-in prompts)",
    )
    gen.add_argument(
        "--max-tokens", type=int, default=32, help="tokens to generate a prompt (default: 32)"
    )
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0.0)")
    gen.add_argument(
        "--seed-sampling", type=int, default=None, help="sampling seed (default: none)"
    )
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_options(gen)
    serve = add_serve_parser(sub)
    serve.add_argument(
        "--headless",
        action="store_true",
        help="run this node's tensor-parallel ranks only (no server), for the engine that "
        "`minivllm serve` runs on node 0: give the same model, --tensor-parallel-size, "
        "--nnodes, --master-addr and --master-port, and this node's --node-rank",
    )
    add_chat_parser(sub)
    bench = sub.add_parser("bench", help="run a benchmark (prints one JSON line)")
    bench.add_argument(
        "kind",
        choices=["throughput", "latency"],
        help="benchmarks/engine/bench_KIND.py (`minivllm bench KIND --help` for its options)",
    )
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's options")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return run_generate(args)
        if args.command == "chat":
            from minivllm.entrypoints.chat_cli import run_chat

            return run_chat(args)
        if args.command == "serve" and args.headless:
            return run_headless_node(args)
        if args.command == "serve":
            return run_serve_checked(args)
        return run_bench(args)
    except (ValueError, TypeError, OSError) as e:
        # Bad options, model directories and files: one line the user can act on.
        print(f"minivllm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("minivllm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
