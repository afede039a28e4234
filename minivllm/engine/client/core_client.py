"""EngineCoreClient: starts the engine-core process and talks to it over one socket pair.

Transport: pickle over a Unix socket pair framed by multiprocessing.connection.Connection
(stdlib; pyzmq and msgspec are not dependencies). EngineRequest and EngineOutput are plain
dataclasses, so pickle moves them as they are; one message per step keeps the per-message
cost (tens of microseconds, see docs/serving.md) far below a step's time. The messages are
listed in core_process.py.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from multiprocessing.connection import Connection

from minivllm.config import EngineConfig
from minivllm.engine.client.protocol import MessageKind
from minivllm.engine.stats import CoreInfo
from minivllm.engine.types import EngineOutput, EngineRequest
from minivllm.models.model_config import ModelConfig
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.params import StructuredOutputSpec

logger = logging.getLogger(__name__)

# Large socket buffers, so that a burst of adds or one big step of outputs rarely blocks.
_SOCKET_BUFFER_BYTES = 4 << 20
_STOP = object()
# How long a core that reported its death, or closed its socket, may take to exit.
_EXIT_WAIT_S = 10.0


class EngineCoreError(RuntimeError):
    """The engine core failed to start, or died."""


class EngineCoreClient:
    """Owns the core process; an EngineClient (engine/client/protocol.py). add/abort never
    block (a writer thread sends them, batched); a reader thread hands every message from the
    core to on_message, and a final (DEAD, reason) when the core goes away unasked; a grammar
    check's answer settles the future check_grammar returned instead."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        on_message: Callable[[tuple], None],
        env: dict[str, str] | None = None,
    ) -> None:
        self._on_message = on_message
        parent_sock, child_sock = socket.socketpair()
        for sock in (parent_sock, child_sock):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER_BYTES)
        fd = child_sock.fileno()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "minivllm.engine.client.core_process", "--fd", str(fd)],
            pass_fds=(fd,),
            env=env,  # None: this process's environment
        )
        child_sock.close()  # the child's end lives only in the child: its death is our EOF
        self._conn = Connection(parent_sock.detach())
        self._closing = False
        self._checks: dict[int, Future[CheckOutcome]] = {}  # open grammar checks, by id
        self._check_ids = itertools.count()
        self._checks_lock = threading.Lock()  # _checks: callers vs the reader thread
        self._gone: str | None = None  # why no check can be answered any more
        try:
            self._conn.send((MessageKind.CONFIG, config, model_config))
            self.info = self._wait_ready()
        except BaseException:
            self._kill()
            self._conn.close()
            raise
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="core-writer", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="core-reader", daemon=True)
        self._writer.start()
        self._reader.start()

    def add_requests(self, requests: list[EngineRequest]) -> None:
        self._outbox.put((MessageKind.ADD, requests))

    def abort_requests(self, req_ids: list[str]) -> None:
        if req_ids:
            self._outbox.put((MessageKind.ABORT, list(req_ids)))

    def check_grammar(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CheckOutcome]:
        future: Future[CheckOutcome] = Future()
        with self._checks_lock:
            if self._gone is not None:
                future.set_exception(EngineCoreError(self._gone))
                return future
            check_id = next(self._check_ids)
            self._checks[check_id] = future
        self._outbox.put((MessageKind.CHECK_GRAMMAR, check_id, spec, refuse_when_busy))
        return future

    @property
    def is_alive(self) -> bool:
        return self.process.poll() is None

    def shutdown(self, timeout: float = 10.0) -> None:
        """Asks the core to stop, waits for it, kills it if it does not; idempotent."""
        if self._closing:
            return
        self._closing = True
        self._outbox.put((MessageKind.SHUTDOWN,))
        self._outbox.put(_STOP)
        self._writer.join(timeout)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("engine core did not stop in %.0f s: killing it", timeout)
        self._kill()
        self._reader.join(timeout)  # it sees EOF once the process is gone
        self._conn.close()

    # ---- internals ------------------------------------------------------------------------

    def _wait_ready(self) -> CoreInfo:
        while not self._conn.poll(1.0):
            if self.process.poll() is not None:
                raise EngineCoreError(
                    f"the engine core process exited with code {self.process.returncode} "
                    "while starting (see its log above)"
                )
        msg = self._conn.recv()
        if msg[0] is MessageKind.FAILED:
            _, is_user_error, message = msg
            # A bad option or model stays a ValueError, which the CLI prints in one line.
            raise (ValueError if is_user_error else EngineCoreError)(
                f"the engine core failed to start: {message}"
            )
        return msg[1]

    def _write_loop(self) -> None:
        """Sends queued messages; consecutive adds (or aborts) go as one message."""
        while True:
            item = self._outbox.get()
            if item is _STOP:
                return
            pending = [item]
            while not self._outbox.empty() and len(pending) < 1024:
                pending.append(self._outbox.get())
            for msg in _merge(pending):
                if msg is _STOP:
                    return
                try:
                    self._conn.send(msg)
                except OSError:
                    return  # the core is gone; the reader reports it

    def _read_loop(self) -> None:
        dead = False
        while not dead:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] is MessageKind.GRAMMAR_CHECKED:
                self._answer_check(msg[1], msg[2])
                continue
            if msg[0] is MessageKind.OUTPUTS:
                msg = (MessageKind.OUTPUTS, [EngineOutput(*fields) for fields in msg[1]], msg[2])
            self._on_message(msg)
            dead = msg[0] is MessageKind.DEAD
        self._fail_checks("the engine core is gone")
        # Reap the core (it exits right after a DEAD message): no zombie is left behind.
        try:
            code = self.process.wait(_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self.process.returncode
        if not dead and not self._closing:
            self._on_message((MessageKind.DEAD, f"the engine core process exited (code {code})"))

    def _answer_check(self, check_id: int, outcome: CheckOutcome) -> None:
        with self._checks_lock:
            future = self._checks.pop(check_id, None)
        if future is not None:
            try:
                future.set_result(outcome)
            except InvalidStateError:  # the asker gave up (cancelled) meanwhile
                pass

    def _fail_checks(self, reason: str) -> None:
        with self._checks_lock:
            self._gone = reason
            open_checks, self._checks = list(self._checks.values()), {}
        for future in open_checks:
            try:
                future.set_exception(EngineCoreError(reason))
            except InvalidStateError:
                pass

    def _kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _merge(messages: list) -> list:
    """Joins runs of consecutive ADD (or ABORT) messages, keeping the order."""
    merged: list = []
    for msg in messages:
        if (
            merged
            and msg is not _STOP
            and merged[-1] is not _STOP
            and msg[0] in (MessageKind.ADD, MessageKind.ABORT)
            and merged[-1][0] == msg[0]
        ):
            merged[-1] = (msg[0], merged[-1][1] + msg[1])
        else:
            merged.append(msg)
    return merged
