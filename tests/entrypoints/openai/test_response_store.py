"""The Responses store: its byte bound is the memory its entries hold (measured with
tracemalloc), and an answer larger than the whole store is refused, not kept and lost."""

from __future__ import annotations

import tracemalloc

from minivllm.entrypoints.openai.responses.store import ResponseStore


def answer(i: int, words: int = 200) -> tuple[dict, list[dict]]:
    text = " ".join(f"word{i}_{k}" for k in range(words))
    response = {
        "id": f"resp_{i}",
        "object": "response",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
        "usage": {"input_tokens": 3, "output_tokens": words},
        "store": True,
    }
    turn = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": text}]
    return response, turn


def test_the_bound_is_the_memory_held():
    max_bytes = 1 << 20
    store = ResponseStore(max_bytes)
    answers = [answer(i) for i in range(400)]  # ~2.4 MB of JSON: the oldest are dropped
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for response, turn in answers:
            assert store.put(response, turn, None)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= 1.2 * max_bytes, f"{held:,} bytes held for a bound of {max_bytes:,}"
    last, turn = answers[-1]
    assert store.get("resp_399").response == last and store.get("resp_399").turn == turn


def test_an_answer_larger_than_the_store_is_refused():
    store = ResponseStore(4096)
    response, turn = answer(0, words=2000)
    assert not store.put(response, turn, None)
    small, small_turn = answer(1, words=5)
    assert store.put(small, small_turn, None)
    assert store.conversation("resp_1") == small_turn
