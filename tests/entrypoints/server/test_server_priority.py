"""--scheduling-policy priority through the server: with one request running at a time, of
two requests queued behind it the one with the lower priority value starts first."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from tests.entrypoints.conftest import MODEL_NAME, Server


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory):
    log = str(tmp_path_factory.mktemp("serve-priority") / "server.log")
    srv = Server(tiny_qwen3_dir, log, "--scheduling-policy", "priority", "--max-num-seqs", "1")
    yield srv
    srv.stop()


def test_the_lower_priority_value_starts_first(server):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    started: dict[str, float] = {}

    async def first_token(name: str, priority: int, max_tokens: int) -> None:
        stream = await client.completions.create(
            model=MODEL_NAME, prompt=[5, 6, 7], max_tokens=max_tokens, stream=True,
            extra_body={"ignore_eos": True, "priority": priority},
        )  # fmt: skip
        async for _ in stream:
            started.setdefault(name, time.monotonic())

    async def run() -> float:
        # The long one runs alone; both others queue behind it, the urgent one sent last.
        long = asyncio.create_task(first_token("long", 0, 480))
        while "long" not in started:
            await asyncio.sleep(0.01)
        later = asyncio.create_task(first_token("later", 5, 2))
        await asyncio.sleep(0.2)  # "later" is queued first
        sent_urgent = time.monotonic()
        await asyncio.gather(first_token("urgent", -1, 2), later, long)
        return sent_urgent

    sent_urgent = asyncio.run(run())
    assert started["long"] < sent_urgent < started["urgent"] < started["later"], started
