"""The server's own work to take in one completion request, on the event loop, without HTTP:
parse and validate the body, build SamplingParams, submit (checks, output processor, core
client). A fake core (no outputs) stands in for the engine. Prints one JSON line: microseconds
per request of each part, for a prompt of --input-len token ids and for the same prompt as text
(its tokenization, done off the loop, not counted).

python -m benchmarks.cpu.bench_intake_cpu [--input-len 1000] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import minivllm.entrypoints.async_llm as async_llm
from benchmarks.common import dummy_model_dir
from benchmarks.cpu.bench_server_cpu import FakeCoreClient
from minivllm.config import EngineConfig
from minivllm.entrypoints.openai.params import sampling_params
from minivllm.entrypoints.openai.protocol import CompletionRequest
from minivllm.entrypoints.server.serving_common import ServerState, submit


def _us_per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return round((time.perf_counter() - start) / n * 1e6, 1)


def _us_per_await(fn, n: int) -> float:
    """_us_per_call for a coroutine function, awaited n times on one event loop."""

    async def run() -> float:
        start = time.perf_counter()
        for i in range(n):
            await fn(i)
        return round((time.perf_counter() - start) / n * 1e6, 1)

    return asyncio.run(run())


def _measure(state: ServerState, kind: str, prompt, ids: list[int], n: int) -> dict:
    """Microseconds per request of each part of taking in one prompt (ids or text)."""
    engine = state.engine
    body = {"model": state.model_name, "prompt": prompt, "max_tokens": 200, "stream": True}
    raw = json.dumps(body).encode()
    req = CompletionRequest.model_validate_json(raw)

    def params_of(_: int):
        return sampling_params(
            req, engine.default_sampling(), len(ids), engine.max_model_len, req.max_tokens, None
        )

    params = params_of(0)
    text = prompt if kind == "text" else None
    return {
        "parse_validate_us": _us_per_call(lambda i: CompletionRequest.model_validate_json(raw), n),
        "sampling_params_us": _us_per_call(params_of, n),
        "submit_us": _us_per_await(
            lambda i: submit(state, f"{kind}-{i}", [(text, ids, params)]), n
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input-len", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    FakeCoreClient.step_s = 3600.0  # never steps: intake only
    async_llm.EngineCoreClient = FakeCoreClient
    model = dummy_model_dir("qwen3-0.6b")
    engine = async_llm.AsyncLLM(EngineConfig(model, load_format="dummy", usage_context="server"))
    state = ServerState(engine, [model], None, log_requests=False)
    rng = random.Random(0)
    ids = [rng.randrange(10, 10000) for _ in range(args.input_len)]
    result: dict = {"bench": "intake_cpu", "input_len": args.input_len}
    try:
        result["ids"] = _measure(state, "ids", ids, ids, args.requests)
        text = engine.tokenizer.decode(ids)
        result["text"] = _measure(state, "text", text, ids, args.requests)
    finally:
        engine.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
