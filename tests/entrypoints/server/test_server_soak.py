"""Soak: many streaming clients with random lengths, disconnects and aborts on a small KV cache
(preemptions, prefix hits) for MINIVLLM_SOAK_SECONDS (default 5). Afterwards every finished
response equals the offline greedy text, the engine is idle with every block free, no 5xx,
and resident memory is flat."""

from __future__ import annotations

import asyncio
import os
import random
import time

import openai

from minivllm import LLM, SamplingParams
from tests.entrypoints.conftest import MODEL_NAME, Server

BASE = [11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144, 155, 166, 177]
PROMPTS = [BASE + [200 + i, 300 + i, 400 + i] for i in range(6)] + [[5, 6, 7], [9] * 30]
LENGTHS = (3, 12, 40)
NUM_CLIENTS = 16


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _client(base_url: str, deadline: float, seed: int, refs: dict, tally: dict) -> None:
    rng = random.Random(seed)
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0) as client:
        while time.time() < deadline:
            await _one_request(client, rng, refs, tally)


async def _one_request(client, rng: random.Random, refs: dict, tally: dict) -> None:
    index, length = rng.randrange(len(PROMPTS)), rng.choice(LENGTHS)
    cut_after = rng.choice([None, None, None, 1, 3])  # disconnect after k chunks
    try:
        stream = await client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPTS[index],
            max_tokens=length,
            temperature=0.0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        texts = []
        async for chunk in stream:
            texts.append(chunk.choices[0].text if chunk.choices else "")
            if cut_after is not None and len(texts) >= cut_after:
                await stream.close()
                tally["disconnects"] += 1
                break
        else:
            tally["completed"] += 1
            if "".join(texts) != refs[index, length]:
                tally["wrong"] += 1
    except openai.APIStatusError as e:
        tally["5xx" if e.status_code >= 500 else "4xx"] += 1


def test_soak(tiny_qwen3_dir, tmp_path) -> None:
    seconds = float(os.environ.get("MINIVLLM_SOAK_SECONDS", "5"))
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    keys = [(i, length) for i in range(len(PROMPTS)) for length in LENGTHS]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in keys]
    prompts = [{"prompt_token_ids": PROMPTS[i]} for i, _ in keys]
    outs = llm.generate(prompts, params, use_tqdm=False)
    refs = {key: out.outputs[0].text for key, out in zip(keys, outs)}
    del llm
    # 48 blocks of 4 tokens: a few requests fill the cache, so preemption happens.
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"), "--num-gpu-blocks-override", "48")
    try:
        warm = {k: 0 for k in ("completed", "disconnects", "wrong", "4xx", "5xx")}
        asyncio.run(_client(server.base_url, time.time() + 2, 99, refs, warm))
        rss_before = _rss_mb(server.proc.pid) + _rss_mb(server.core_pid)
        tally = {k: 0 for k in warm}

        async def run() -> None:
            deadline = time.time() + seconds
            await asyncio.gather(
                *(_client(server.base_url, deadline, s, refs, tally) for s in range(NUM_CLIENTS))
            )

        asyncio.run(run())
        deadline = time.time() + 10
        while time.time() < deadline:
            metrics = server.metrics()
            idle = (
                metrics["minivllm:num_requests_running"] + metrics["minivllm:num_requests_waiting"]
            )
            if idle == 0 and metrics["minivllm:kv_cache_usage_perc"] == 0:
                break
            time.sleep(0.1)
        rss_after = _rss_mb(server.proc.pid) + _rss_mb(server.core_pid)
        print(
            f"soak {seconds:.0f}s: {tally}, preemptions "
            f"{metrics['minivllm:num_preemptions_total']:.0f}, prefix hits "
            f"{metrics['minivllm:prefix_cache_hits_total']:.0f}, RSS {rss_before:.0f} -> "
            f"{rss_after:.0f} MB"
        )
        assert tally["5xx"] == 0 and tally["4xx"] == 0 and tally["wrong"] == 0
        # Counts depend on the machine's speed; correctness does not.
        assert tally["completed"] >= 5 and tally["disconnects"] >= 5
        assert metrics["minivllm:num_requests_running"] == 0
        assert metrics["minivllm:num_requests_waiting"] == 0
        assert metrics["minivllm:kv_cache_usage_perc"] == 0.0  # every block free (or cached)
        assert metrics["minivllm:num_preemptions_total"] > 0
        assert rss_after < rss_before + 100  # MB: no per-request leak
        assert server.request("GET", "/health")[0] == 200
    finally:
        assert server.stop() == 0
