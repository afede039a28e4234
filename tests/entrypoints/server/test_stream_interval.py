"""--stream-interval (vLLM's option): a stream gets its new tokens every N tokens, with the
same text, and its first token at once."""

from __future__ import annotations

import json

from tests.entrypoints.conftest import MODEL_NAME, Server

BODY = {
    "model": MODEL_NAME,
    "prompt": "The quick brown fox",
    "max_tokens": 13,
    "temperature": 0.0,
    "logprobs": 0,  # each chunk lists its tokens
    "ignore_eos": True,
    "stream_options": {"include_usage": True},
}


def _stream(server: Server, headers: dict | None = None) -> tuple[list[dict], str]:
    """The choice chunks of one streamed completion, and the non-streamed text."""
    status, body = server.request("POST", "/v1/completions", {**BODY, "stream": True}, headers)
    assert status == 200, body
    chunks = [
        json.loads(line[len("data: ") :])
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert chunks[-1]["usage"]["completion_tokens"] == 13
    status, full = server.request("POST", "/v1/completions", BODY, headers)
    assert status == 200, full
    return [c for c in chunks if c["choices"]], full["choices"][0]["text"]


def _tokens_per_chunk(chunks: list[dict]) -> list[int]:
    return [len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks]


def test_stream_interval_sends_tokens_in_groups_with_the_same_text(
    server: Server, auth: dict, tiny_qwen3_dir: str, tmp_path
) -> None:
    every_token, text = _stream(server, auth)  # the shared server: --stream-interval 1
    assert sum(_tokens_per_chunk(every_token)) == 13
    grouped = Server(tiny_qwen3_dir, str(tmp_path / "server.log"), "--stream-interval", "4")
    try:
        chunks, full_text = _stream(grouped)
    finally:
        assert grouped.stop() == 0
    assert full_text == text
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    counts = _tokens_per_chunk(chunks)
    # The first tokens at once, then groups of at least 4 more than the stream last read
    # (more if it fell behind), the rest with the last: e.g. [1, 4, 4, 4] or [2, 4, 4, 3].
    assert sum(counts) == 13 and len(counts) <= 4 < len(every_token)
    assert all(n >= 4 for n in counts[1:-1]), counts
