"""`minivllm serve --data-parallel-size 2`: two engine-core replicas behind one AsyncLLM give
the offline API's greedy text, stream, spread requests over both replicas, and exit clean."""

from __future__ import annotations

import asyncio
import signal

import openai

from minivllm import LLM, EngineConfig, SamplingParams
from minivllm.entrypoints.async_llm import AsyncLLM
from tests.entrypoints.conftest import (
    BLOCK_SIZE,
    CPU_FLAGS,
    MODEL_NAME,
    NUM_BLOCKS,
    Server,
    alive,
    child_pids,
)

PROMPTS = [[7 + i, 19, 42, 99 - i, 3, 5] for i in range(4)]
GREEDY = dict(temperature=0.0, max_tokens=8, extra_body={"ignore_eos": True})
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _offline_texts(model_dir: str) -> list[str]:
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=BLOCK_SIZE)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def test_dp2_server_matches_offline_streams_and_exits_clean(tiny_qwen3_dir, tmp_path) -> None:
    flags = (*CPU_FLAGS, "--data-parallel-size", "2")
    server = Server(tiny_qwen3_dir, str(tmp_path / "server.log"), engine_flags=flags)
    cores = child_pids(server.proc.pid)
    try:
        assert len(cores) == 2  # one engine-core process per replica
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        out = client.completions.create(model=MODEL_NAME, prompt=PROMPTS, **GREEDY)
        texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
        assert texts == _offline_texts(tiny_qwen3_dir)
        stream = client.completions.create(
            model=MODEL_NAME, prompt=PROMPTS[1], stream=True, **GREEDY
        )
        assert "".join(c.choices[0].text for c in stream if c.choices) == texts[1]
        assert server.request("GET", "/health")[0] == 200
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0
    assert not any(alive(pid) for pid in cores)


def test_async_llm_dp2_spreads_requests(tiny_qwen3_dir) -> None:
    config = EngineConfig(
        model=tiny_qwen3_dir,
        device="cpu",
        dtype="float32",
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=NUM_BLOCKS,
        data_parallel_size=2,
    )
    engine = AsyncLLM(config)

    async def one(i: int) -> str:
        outputs = [out async for out in engine.generate(f"r{i}", None, PROMPTS[i], PARAMS)]
        return outputs[-1].outputs[0].text

    async def run() -> list[str]:
        engine.attach_loop(asyncio.get_running_loop())
        texts = await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))
        engine._client.replicas[1].process.kill()  # one replica dies: the engine is dead
        for _ in range(100):
            if engine.is_dead:
                break
            await asyncio.sleep(0.1)
        return texts

    try:
        assert engine.info.num_blocks == NUM_BLOCKS
        texts = asyncio.run(run())
        balancer = engine._client.balancer
        assert balancer.num_assigned == [2, 2]  # equal requests: alternate replicas
        assert balancer.load == [0, 0] and not balancer.replica_of
        assert texts == _offline_texts(tiny_qwen3_dir)
        assert engine.stats.num_running == 0
        assert engine.is_dead and "replica 1" in engine.dead_reason
    finally:
        engine.shutdown()
    assert not any(r.is_alive for r in engine._client.replicas)
