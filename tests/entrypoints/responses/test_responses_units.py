"""The Responses API's pieces without a server: input items as chat messages, and the store
of answers (bounded, least recently used first out, conversations as chains of turns)."""

from __future__ import annotations

import pytest

from minivllm.entrypoints.responses.input import input_messages
from minivllm.entrypoints.server.errors import APIError
from minivllm.entrypoints.server.response_store import ResponseStore


def test_an_assistant_turn_of_items_is_one_message():
    call = {"type": "function_call", "name": "f", "arguments": "{}"}
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Calling.", "annotations": []}]},
        {**call, "call_id": "c1"},
        {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}]},
        {**call, "call_id": "c3"},
        {"type": "function_call_output", "call_id": "c3", "output": "three"},
        "Thanks",
    ]  # fmt: skip
    items[-1] = {"role": "user", "content": "Thanks"}

    def calls(*ids):
        return [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ]

    assert input_messages(items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "reasoning": "hm",
            "content": "Calling.",
            "tool_calls": calls("c1", "c2"),
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "tool_calls": calls("c3")},
        {"role": "tool", "tool_call_id": "c3", "content": "three"},
        {"role": "user", "content": "Thanks"},
    ]
    assert input_messages("Hello") == [{"role": "user", "content": "Hello"}]


def _response(response_id: str, text: str = "") -> dict:
    return {"id": response_id, "output_text": text}


def test_the_store_drops_the_least_recently_used_past_its_bytes():
    store = ResponseStore(max_bytes=400)  # three entries of 118 bytes (their JSON text)
    turn = [{"role": "user", "content": "x" * 40}]
    for name in ("a", "b", "c"):
        store.put(_response(name), turn, None)
    store.get("a")  # now the most recently used: "b" goes first
    store.put(_response("d"), turn, None)
    with pytest.raises(APIError) as e:
        store.get("b")
    assert e.value.status == 404
    assert [store.get(n).response["id"] for n in ("a", "c", "d")] == ["a", "c", "d"]
    assert not store.put(_response("huge"), [{"role": "user", "content": "x" * 400}], None)
    with pytest.raises(APIError):
        store.get("huge")  # larger than the whole store: not kept, nothing dropped for it
    store.get("a")
    store.delete("a")
    with pytest.raises(APIError):
        store.delete("a")


def test_a_conversation_is_its_chain_of_turns():
    store = ResponseStore()
    store.put(_response("r1"), [{"role": "user", "content": "1"}], None)
    store.put(_response("r2"), [{"role": "user", "content": "2"}], "r1")
    store.put(_response("r3"), [{"role": "user", "content": "3"}], "r2")
    assert [m["content"] for m in store.conversation("r3")] == ["1", "2", "3"]
    store.delete("r2")
    with pytest.raises(APIError, match="no longer stored") as e:
        store.conversation("r3")
    assert e.value.status == 400
    with pytest.raises(ValueError):
        ResponseStore(-1)
    assert not ResponseStore(0).enabled
