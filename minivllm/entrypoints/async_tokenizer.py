"""Prompt tokenization off the server's event loop: queued texts are encoded in batches by one
worker thread (a 1,000-token prompt takes ~1 ms; on the loop, a wave of them stalls every
stream). docs/serving.md has the figures."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from minivllm.entrypoints.processing import check_unicode


class AsyncTokenizer:
    """`await encode(text)` gives what `tokenizer.encode(text)` gives, from a worker thread;
    a text the tokenizer cannot encode raises ValueError."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        # One thread, not a pool: an HF fast tokenizer's truncation and padding state is shared
        # by concurrent calls. A batch still runs on several cores (Rust, GIL released).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        # (text, add_special_tokens, future) waiting for the next batch, and whether the
        # task that drains them is running.
        self._queue: list[tuple[str, bool, asyncio.Future]] = []
        self._draining = False

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append((text, bool(add_special_tokens), future))
        if not self._draining:
            self._draining = True
            loop.create_task(self._drain(loop))
        return await future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                for add_special in (True, False):
                    items = [item for item in batch if item[1] is add_special]
                    if items:
                        await self._encode_items(loop, items, add_special)
        finally:
            self._draining = False

    async def _encode_items(self, loop, items: list, add_special: bool) -> None:
        texts = [text for text, _, _ in items]
        try:
            results = await loop.run_in_executor(
                self._executor, self._encode_batch, texts, add_special
            )
        except asyncio.CancelledError:  # the loop is closing: so are the requests waiting
            for _, _, future in items:
                future.cancel()
            raise
        except RuntimeError as e:  # the executor was shut down: fail, never leave waiting
            results = [RuntimeError(f"the tokenizer is shut down ({e})")] * len(items)
        for (_, _, future), result in zip(items, results):
            if future.done():  # its request was cancelled (the client went away)
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _encode_batch(self, texts: list[str], add_special_tokens: bool) -> list:
        """Token ids per text; where the batch fails, each text alone, so that a bad text
        fails only its own request (a ValueError in its place)."""
        try:
            if len(texts) > 1:
                return self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
        except Exception:  # noqa: BLE001 - retried one by one below
            pass
        results: list = []
        for text in texts:
            try:
                check_unicode(text, "the text")
                results.append(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
            except ValueError as e:
                results.append(e)
            except Exception as e:  # noqa: BLE001 - handed to the request that sent it
                results.append(ValueError(f"the text could not be tokenized: {e}"))
        return results
