"""AsyncTokenizer: the server's prompts tokenized off the loop, by a pool of worker threads."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from minivllm.entrypoints.async_tokenizer import (
    AsyncTokenizer,
    TokenizerClosedError,
    max_chars_per_token,
)
from minivllm.tokenizer import load_tokenizer

TEXTS = [
    f"request {i}: the quick brown fox {'jumps ' * (i % 7)}over the lazy dog" for i in range(40)
]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir: str):
    return load_tokenizer(tiny_qwen3_dir)


def test_equals_encode_through_the_rust_backend_on_several_threads(tokenizer) -> None:
    async_tokenizer = AsyncTokenizer(tokenizer, num_threads=4)
    assert async_tokenizer._backend is tokenizer.backend_tokenizer
    assert async_tokenizer.num_threads == 4

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


class _Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class SlowBackend:
    """A Rust-like backend whose encode takes 0.2 s without holding the GIL."""

    truncation = padding = None

    def encode_batch(self, texts, add_special_tokens=True):
        time.sleep(0.2)
        return [_Encoding([len(t)]) for t in texts]


class SlowFastTokenizer:
    backend_tokenizer = SlowBackend()

    def encode(self, text, add_special_tokens=True):
        return [len(text)]


def test_a_burst_is_encoded_in_parallel() -> None:
    async_tokenizer = AsyncTokenizer(SlowFastTokenizer(), num_threads=4)

    async def run():
        return await asyncio.gather(*(async_tokenizer.encode("x" * n) for n in range(1, 5)))

    start = time.perf_counter()
    try:
        ids = asyncio.run(run())
    finally:
        async_tokenizer.shutdown()
    assert ids == [[1], [2], [3], [4]]
    assert time.perf_counter() - start < 0.6  # one thread: 0.8 s


def test_a_backend_with_truncation_is_not_called_directly(tiny_qwen3_dir: str) -> None:
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    tokenizer.backend_tokenizer.enable_truncation(4)  # state the HF wrapper resets per call
    async_tokenizer = AsyncTokenizer(tokenizer, num_threads=4)
    assert async_tokenizer._backend is None and async_tokenizer.num_threads == 1

    async def run():
        return await async_tokenizer.encode(TEXTS[5])

    try:
        ids = asyncio.run(run())
    finally:
        async_tokenizer.shutdown()
    assert ids == tokenizer.encode(TEXTS[5]) and len(ids) > 4


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
    """No Rust backend: encoded through encode(), on one thread."""

    def encode(self, text, add_special_tokens=True):
        time.sleep(0.3)
        return [len(text)]


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


def test_work_queued_at_shutdown_fails_instead_of_being_cancelled(tokenizer) -> None:
    """A request whose tokenizing was still queued when the server shut down gets an error
    (a 503 upstream), not a CancelledError that uvicorn would log as a crash."""
    async_tokenizer = AsyncTokenizer(tokenizer, num_threads=1)
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        return "done"

    async def run():
        first = asyncio.ensure_future(async_tokenizer.run(slow))
        queued = asyncio.ensure_future(async_tokenizer.run(slow))
        await asyncio.to_thread(started.wait, 10)
        async_tokenizer.shutdown()  # the queued call is cancelled in the executor
        return await asyncio.gather(first, queued, return_exceptions=True)

    first, queued = asyncio.run(run())
    assert first == "done"
    assert isinstance(queued, TokenizerClosedError)


def test_max_chars_per_token_is_the_longest_vocabulary_entry(tokenizer) -> None:
    assert max_chars_per_token(tokenizer) == max(len(t) for t in tokenizer.get_vocab())
    async_tokenizer = AsyncTokenizer(tokenizer)
    async_tokenizer.shutdown()
    assert async_tokenizer.max_chars_per_token == 13  # "<|endoftext|>"
