"""SSEChunks writes exactly what json.dumps of the whole chunk would (same keys, same order,
same escaping), for the value types the endpoints put in a choice."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from minivllm.entrypoints.server.streaming import SSEChunks

HEAD = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m\u00e9", "x": None}
SCALARS = st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def reference(payload: dict) -> bytes:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


@given(st.dictionaries(st.text(), VALUES, max_size=6))
def test_choice_chunk_equals_json_dumps(choice: dict) -> None:
    assert SSEChunks(HEAD).choice(choice) == reference({**HEAD, "choices": [choice]})


def test_typical_chunks() -> None:
    chunks = SSEChunks(HEAD)
    choice = {"index": 3, "text": 'a"b\n\u4e2d\U0001f600\x00', "logprobs": None, "stop_reason": 7}
    assert chunks.choice(choice) == reference({**HEAD, "choices": [choice]})
    last = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    assert chunks.last(last) == reference({**HEAD, **last})
    assert json.loads(chunks.choice(choice)[6:])["choices"][0]["text"] == choice["text"]
