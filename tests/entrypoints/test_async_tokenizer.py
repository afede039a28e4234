"""AsyncTokenizer: the server's prompts tokenized in one worker thread, batched, off the loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from minivllm.entrypoints.async_tokenizer import AsyncTokenizer
from minivllm.gguf_loader import load_tokenizer

TEXTS = [
    f"request {i}: the quick brown fox {'jumps ' * (i % 7)}over the lazy dog" for i in range(40)
]


class CountingTokenizer:
    """A real tokenizer that records the size of every batched call."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.batch_sizes: list[int] = []

    def __call__(self, texts, add_special_tokens=True):
        self.batch_sizes.append(len(texts))
        return self.tokenizer(texts, add_special_tokens=add_special_tokens)

    def encode(self, text, add_special_tokens=True):
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir: str):
    return load_tokenizer(tiny_qwen3_dir)


def test_equals_encode_and_batches(tokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    async_tokenizer = AsyncTokenizer(counting)

    async def run():
        return await asyncio.gather(
            *(async_tokenizer.encode(t, add_special_tokens=i % 3 != 0) for i, t in enumerate(TEXTS))
        )

    try:
        results = asyncio.run(run())
    finally:
        async_tokenizer.shutdown()
    for i, (text, ids) in enumerate(zip(TEXTS, results)):
        assert ids == tokenizer.encode(text, add_special_tokens=i % 3 != 0)
    assert max(counting.batch_sizes) > 1  # concurrent requests share a batched call


def test_a_bad_text_fails_only_its_own_request(tokenizer) -> None:
    async_tokenizer = AsyncTokenizer(tokenizer)

    async def run():
        texts = ["fine", "a\ud800b", "also fine"]
        return await asyncio.gather(
            *(async_tokenizer.encode(t) for t in texts), return_exceptions=True
        )

    try:
        good, bad, also_good = asyncio.run(run())
    finally:
        async_tokenizer.shutdown()
    assert good == tokenizer.encode("fine") and also_good == tokenizer.encode("also fine")
    assert isinstance(bad, ValueError) and "not valid Unicode" in str(bad)


class SlowTokenizer:
    def __call__(self, texts, add_special_tokens=True):
        time.sleep(0.3)
        return {"input_ids": [[len(t)] for t in texts]}

    def encode(self, text, add_special_tokens=True):
        return self(["x"])["input_ids"][0]


def test_the_event_loop_runs_while_it_encodes() -> None:
    async_tokenizer = AsyncTokenizer(SlowTokenizer())

    async def run():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        ids = await asyncio.gather(async_tokenizer.encode("ab"), async_tokenizer.encode("abc"))
        task.cancel()
        return ids, ticks

    try:
        ids, ticks = asyncio.run(run())
    finally:
        async_tokenizer.shutdown()
    assert ids == [[2], [3]]
    assert ticks >= 10  # 0.3 s of tokenizing; encoding on the loop would allow none


def test_encode_after_shutdown_raises_instead_of_hanging(tokenizer) -> None:
    async_tokenizer = AsyncTokenizer(tokenizer)
    async_tokenizer.shutdown()

    async def run():
        return await asyncio.wait_for(async_tokenizer.encode("hello"), timeout=10)

    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(run())
