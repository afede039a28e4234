"""shared_compiler builds a tokenizer's grammar backend once per process, also when many
threads ask at once (a server's first constrained requests each check their spec on a
thread of their own): the others wait for that build instead of making their own."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from minivllm.structured_output import manager


def test_threads_that_ask_together_share_one_build(monkeypatch) -> None:
    builds: list[str] = []

    class SlowBackend:
        def __init__(self, tokenizer, vocab_size):
            builds.append(threading.current_thread().name)
            time.sleep(0.2)  # the tokenizer and llguidance's trie take about a second

    monkeypatch.setattr(manager, "load_tokenizer", lambda path: path)
    monkeypatch.setattr(manager, "LLGuidanceBackend", SlowBackend)
    # A key no other test builds: the cache is the process's.
    key = ("/nonexistent/tokenizer-for-the-race", 12345)
    with ThreadPoolExecutor(8) as pool:
        compilers = list(pool.map(lambda _: manager.shared_compiler(*key), range(16)))
    assert len(builds) == 1
    assert all(c is compilers[0] for c in compilers)
    assert manager.shared_compiler(*key) is compilers[0]
