"""The Responses store: its byte bound is the memory its entries hold (measured with
tracemalloc), and an answer larger than the whole store is refused, not kept and lost."""

from __future__ import annotations

import tracemalloc

from minivllm.entrypoints.server.response_store import ResponseStore


def answer(i: int, words: int = 200) -> tuple[dict, list[dict]]:
    """A response with its tokens' logprobs (many small objects, as the server's are)."""
    tokens = [f"w{i}_{k}" for k in range(words)]
    text = " ".join(tokens)
    logprobs = [
        {"token": t, "logprob": -0.5 - k / 1000, "bytes": list(t.encode()), "top_logprobs": []}
        for k, t in enumerate(tokens)
    ]
    part = {"type": "output_text", "text": text, "logprobs": logprobs}
    response = {
        "id": f"resp_{i}",
        "object": "response",
        "output": [{"type": "message", "content": [part]}],
        "usage": {"input_tokens": 3, "output_tokens": words},
        "store": True,
    }
    turn = [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": " ".join(tokens)},
    ]
    return response, turn


def test_the_bound_is_the_memory_held():
    max_bytes = 512 << 10
    store = ResponseStore(max_bytes)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(100):  # ~2 MB of JSON: the oldest are dropped
            response, turn = answer(i)  # as the server builds them: only the store keeps them
            store.put(response, turn, None)
        del response, turn
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= 1.2 * max_bytes, f"{held:,} bytes held for a bound of {max_bytes:,}"
    last, turn = answer(99)
    assert store.get("resp_99").response == last and store.get("resp_99").turn == turn


def test_an_answer_larger_than_the_store_is_refused():
    store = ResponseStore(4096)
    response, turn = answer(0, words=2000)
    assert not store.put(response, turn, None)
    small, small_turn = answer(1, words=5)
    assert store.put(small, small_turn, None)
    assert store.conversation("resp_1") == small_turn
