"""The uvicorn server of `minivllm serve`: a deadline on request heads, and a shutdown that
fails what is still open cleanly (docs/serving.md, "Limits" and "Shutdown")."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from minivllm.entrypoints.async_llm import AsyncLLM

logger = logging.getLogger("minivllm.serve")
# uvicorn's own graceful deadline comes this long after ours, for the 503s to go out.
_FAIL_MARGIN_S = 3.0


def build_server(
    app: FastAPI,
    engine: AsyncLLM,
    host: str,
    port: int,
    access_log: bool,
    timeout_graceful_shutdown: float,
    read_timeout_s: float,
) -> uvicorn.Server:
    """The uvicorn server of `minivllm serve`: h11 with a deadline on request heads
    (_DeadlineH11), keep-alive connections closed after 30 s idle, and a shutdown that fails
    what is still open cleanly (GracefulServer)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=partial(_DeadlineH11, head_timeout_s=read_timeout_s),
        access_log=access_log,
        timeout_graceful_shutdown=timeout_graceful_shutdown + _FAIL_MARGIN_S,
        timeout_keep_alive=30,  # a request head is at most h11's 16 KiB (uvicorn's default)
    )
    return GracefulServer(config, engine, timeout_graceful_shutdown)


class GracefulServer(uvicorn.Server):
    """uvicorn's Server, except that what is still open grace_s after SIGINT/SIGTERM is
    failed by the app, as docs/serving.md promises: a 503 JSON, or an error chunk then
    [DONE] (uvicorn would cancel the tasks: a plain-text 500, a cut stream, a traceback).
    uvicorn's own deadline, _FAIL_MARGIN_S later, is the last resort."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, grace_s: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.grace_s = grace_s

    async def shutdown(self, sockets=None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._fail_open_requests)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _fail_open_requests(self) -> None:
        logger.warning(
            "--timeout-graceful-shutdown (%.0f s) is over: failing %d open request(s)",
            self.grace_s,
            self.engine.num_open_requests,
        )
        self.engine.shutdown()  # fails every open request (EngineDeadError) and stops the core


class _DeadlineH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request heads, which uvicorn lacks: a
    connection whose request line and headers have not all arrived head_timeout_s after it
    opened (or after its last response) gets a 408 and is closed, so a client sending a byte
    every few seconds holds no connection. (Bodies have their deadline in read_body.)"""

    def __init__(self, *args, head_timeout_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or (self.cycle and not self.cycle.response_complete):
            return  # closed, or a request is being served: its head is in
        if self.timeout_keep_alive_task is not None and not self.conn.trailing_data[0]:
            self._arm_head_deadline()  # idle keep-alive, nothing sent yet: uvicorn's timer
            return
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        self.transport.close()
