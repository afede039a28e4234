"""Prompt tokenization off the server's event loop, on several cores at once.

A 1,000-token prompt takes ~1 ms to encode; on the loop, a wave of them stalls every stream.
So texts go to a pool of worker threads. Each calls the Rust tokenizer behind the HF one
(`backend_tokenizer.encode_batch([text])`, which releases the GIL), so a burst of 128 prompts
is encoded on as many cores as the pool has threads. Chat templates and decodes of whole id
lists run there too (`run`). docs/serving.md says why.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from minivllm.entrypoints.processing import check_unicode

# A text that exercises what may differ between the HF wrapper and its Rust backend (special
# tokens, spaces, digits, non-ASCII): the backend is used only if both agree on it.
_PROBE = "Hello, world!  It's 2026: 12 345 tokens \u00fcber alles \u4f60\u597d \n\tend"
T = TypeVar("T")


class TokenizerClosedError(RuntimeError):
    """The tokenizer was shut down (the server is shutting down) before the work was done."""


class AsyncTokenizer:
    """`await encode(text)` gives what `tokenizer.encode(text)` gives, from a worker thread;
    a text the tokenizer cannot encode raises ValueError."""

    def __init__(self, tokenizer, num_threads: int | None = None) -> None:
        self.tokenizer = tokenizer
        self._backend = _stateless_backend(tokenizer)
        # The Rust backend is stateless here and thread-safe: one thread a core (up to 8).
        # Without it, one thread: an HF tokenizer's truncation and padding state is shared by
        # concurrent calls.
        if self._backend is None:
            self.num_threads = 1
        else:
            self.num_threads = num_threads or min(8, os.cpu_count() or 1)
        self._executor = ThreadPoolExecutor(self.num_threads, thread_name_prefix="tokenizer")
        self.max_chars_per_token = max_chars_per_token(tokenizer)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self.run(self._encode, text, add_special_tokens)

    async def run(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on a worker thread (a chat template, a long decode): the loop keeps
        serving other requests meanwhile. TokenizerClosedError once shut down."""
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, fn, *args)
        except RuntimeError as e:  # the executor was shut down: fail, never leave waiting
            raise TokenizerClosedError(f"the tokenizer is shut down ({e})") from None
        try:
            return await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled (its client went away)
            # shutdown() cancelled the queued work: the caller's request fails, it is not cancelled
            raise TokenizerClosedError("the tokenizer is shut down") from None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        check_unicode(text, "the text")
        try:
            if self._backend is None:
                return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
            (encoding,) = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
            return encoding.ids
        except Exception as e:  # noqa: BLE001 - the request's fault: its own 400
            raise ValueError(f"the text could not be tokenized: {e}") from None


def max_chars_per_token(tokenizer) -> int:
    """The most characters one token can stand for: the longest vocabulary entry (byte-level
    BPE spells one byte as one character, SentencePiece one character as one). A text of more
    than max_model_len * this characters cannot fit, whatever its tokens are (for tokenizers
    whose normalizer drops no characters: those of the models served here)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - no vocabulary to read: a bound that never rejects
        return 1 << 30
    return max((len(entry) for entry in vocab), default=1)


def _stateless_backend(tokenizer):
    """The HF fast tokenizer's Rust tokenizer when calling it directly gives what
    tokenizer.encode gives (no truncation or padding configured, same ids on a probe text
    with and without special tokens); else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    try:
        for add_special in (True, False):
            direct = backend.encode_batch([_PROBE], add_special_tokens=add_special)[0].ids
            if direct != tokenizer.encode(_PROBE, add_special_tokens=add_special):
                return None
    except Exception:  # noqa: BLE001 - anything unexpected: the wrapper, one thread
        return None
    return backend
