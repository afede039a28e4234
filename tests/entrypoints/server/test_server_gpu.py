"""GPU: streaming through the server costs < 10 % of offline throughput at 128 clients
(the serving target), on a Qwen3-0.6B-shaped model with dummy weights. `pytest -m gpu -s`.

The clients are benchmarks/sse_client.py's raw-socket streams, as bench_serving.py's: the
official openai client spends ~100 us of CPU a chunk, so one client process caps the rate
below the server's (docs/serving.md, section 5) and the test would measure its client."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch

from benchmarks.sse_client import stream_completion
from minivllm import LLM, SamplingParams
from minivllm.tiny_model import make_dummy_model_dir
from tests.entrypoints.conftest import MODEL_NAME, Server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
NUM_PROMPTS, CONCURRENCY, INPUT_LEN, OUTPUT_LEN = 512, 128, 1000, 200


async def _drive(port: int, prompts: list[list[int]]) -> float:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(prompt) -> int:
        body = {
            "model": MODEL_NAME,
            "prompt": prompt,
            "max_tokens": OUTPUT_LEN,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        async with sem:
            result = await stream_completion(port, body)
        return result.usage["completion_tokens"]

    await asyncio.gather(*(one(p) for p in prompts[:CONCURRENCY]))  # warm up
    start = time.perf_counter()
    counts = await asyncio.gather(*(one(p) for p in prompts))
    elapsed = time.perf_counter() - start
    assert counts == [OUTPUT_LEN] * len(prompts)
    return sum(counts) / elapsed


def test_streaming_keeps_offline_throughput(tmp_path) -> None:
    model = make_dummy_model_dir("qwen3-0.6b", str(tmp_path / "model"))
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 10000) for _ in range(INPUT_LEN)] for _ in range(NUM_PROMPTS)]
    flags = ("--load-format", "dummy", "--max-model-len", "4096")
    server = Server(
        model, str(tmp_path / "server.log"), "--disable-log-requests", engine_flags=flags
    )
    try:
        served = asyncio.run(_drive(server.port, prompts))
    finally:
        assert server.stop() == 0
    llm = LLM(model, load_format="dummy", max_model_len=4096, max_num_seqs=CONCURRENCY)
    params = SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:CONCURRENCY]], params, use_tqdm=False)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    offline = NUM_PROMPTS * OUTPUT_LEN / (time.perf_counter() - start)
    llm.shutdown()
    print(f"served {served:.0f} tok/s, offline {offline:.0f} tok/s, ratio {served / offline:.3f}")
    assert served >= 0.9 * offline
