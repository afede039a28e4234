"""A light streaming client for /v1/completions: raw asyncio sockets, one JSON parse a chunk.

The official openai client costs ~100+ us of client CPU per streamed chunk (httpx, SSE
decoding, pydantic models): one client process then tops out near the server's own rate,
and a benchmark would measure its client. This one costs a few microseconds a chunk.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    start: float  # perf_counter() when the request was sent
    text_times: list[float] = field(default_factory=list)  # arrival of each chunk with text
    num_chunks: int = 0  # data chunks, the usage chunk included
    usage: dict | None = None


async def stream_completion(port: int, body: dict, host: str = "127.0.0.1") -> StreamResult:
    """POSTs body (with "stream": true) to /v1/completions; reads the stream to [DONE]."""
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, port)
    result = StreamResult(time.perf_counter())
    writer.write(head + payload)
    pending, done = b"", False
    try:
        while not done and (data := await reader.read(1 << 16)):
            now = time.perf_counter()
            # Each SSE event ends with a blank line; HTTP chunk-size lines sit between them.
            *events, pending = (pending + data).split(b"\n\n")
            for event in events:
                start = event.find(b"data: ")
                if start == -1:
                    continue
                if event.startswith(b"data: [DONE]", start):
                    done = True
                    break
                chunk = json.loads(event[start + 6 :])
                if "error" in chunk:
                    raise RuntimeError(f"the server sent an error: {chunk['error']}")
                result.num_chunks += 1
                if chunk.get("usage"):
                    result.usage = chunk["usage"]
                if any(c.get("text") for c in chunk["choices"]):
                    result.text_times.append(now)
    finally:
        writer.close()
    if not done:
        raise RuntimeError(f"the stream ended without [DONE]: {pending[-300:]!r}")
    return result
