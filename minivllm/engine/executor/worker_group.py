"""Rank 0's side of the worker processes: launch, READY handshake, death watch, reaping.

Each worker is `python -m minivllm.engine.executor.tp_worker` (never the user's script), in its own
session (a Ctrl-C in the terminal reaches rank 0 only). Its stdin carries the WorkerSpec and
then stays open: when this process dies, the worker reads EOF and exits. A thread per worker
reads its status pipe; EOF there means the worker died, and is recorded at once.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from minivllm.engine.executor.tp_worker import WorkerSpec

_LENGTH = struct.Struct("<Q")


def _read_message(fd: int) -> tuple | None:
    """The next length-prefixed message of a status pipe, or None at EOF."""
    head = _read_exact(fd, _LENGTH.size)
    if head is None:
        return None
    body = _read_exact(fd, _LENGTH.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        part = os.read(fd, n - got)
        if not part:
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class WorkerGroup:
    """Ranks 1..N-1 as subprocesses. `failure` is None while all of them are healthy."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        on_failure: Callable[[], None],
        module: str = "minivllm.engine.executor.tp_worker",
    ) -> None:
        """module: the workers' entry point (`python -m module --status-fd N`)."""
        self.procs: list[subprocess.Popen] = []
        self.failure: str | None = None
        self._on_failure = on_failure
        self._status: dict[int, list[tuple]] = {spec.rank: [] for spec in specs}
        self._cond = threading.Condition()
        self._stopping = False
        self._module = module
        env = dict(os.environ)
        # The worker imports this very minivllm, wherever it was imported from.
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for spec in specs:
            self._start(spec, env)

    def _start(self, spec: WorkerSpec, env: dict[str, str]) -> None:
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    self._module,
                    "--status-fd",
                    str(write_fd),
                ],
                stdin=subprocess.PIPE,
                pass_fds=(write_fd,),
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        self.procs.append(proc)
        data = pickle.dumps(spec)
        try:
            proc.stdin.write(_LENGTH.pack(len(data)) + data)
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died at once: the watcher below records how
        threading.Thread(
            target=self._watch, args=(spec.rank, proc, read_fd), daemon=True, name="tp-watch"
        ).start()

    def _watch(self, rank: int, proc: subprocess.Popen, fd: int) -> None:
        try:
            while (message := _read_message(fd)) is not None:
                with self._cond:
                    self._status[rank].append(message)
                    if message[0] == "error":
                        self._fail(f"tensor-parallel worker rank {rank} failed: {message[1]}")
                    self._cond.notify_all()
        finally:
            os.close(fd)
        code = proc.wait()
        with self._cond:
            if not self._stopping:
                self._fail(
                    f"tensor-parallel worker rank {rank} (pid {proc.pid}) died with exit code "
                    f"{code}; the engine cannot continue, create a new LLM"
                )
            self._cond.notify_all()

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            self._on_failure()

    def wait_for(self, what: str, timeout: float) -> list[tuple]:
        """Waits until every worker sent a `what` message; raises RuntimeError at once when
        one fails first. Returns those messages in rank order."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self.check()
                found = [
                    next((m for m in ms if m[0] == what), None) for ms in self._status.values()
                ]
                if all(found):
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"tensor-parallel workers did not report {what!r} in time")
                self._cond.wait(min(left, 1.0))

    def num_step_errors(self) -> int:
        """How many failed steps every worker has reported so far."""
        with self._cond:
            return min(sum(m[0] == "step_error" for m in ms) for ms in self._status.values())

    def error_of(self, rank: int) -> str | None:
        """The start-up error a worker reported, if it did."""
        with self._cond:
            return next((m[1] for m in self._status[rank] if m[0] == "error"), None)

    def check(self) -> None:
        """Raises RuntimeError when a worker has failed or died."""
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def stop(self, grace: float) -> None:
        """Gives the workers grace seconds to exit (after SHUTDOWN), then closes their stdin
        (they exit at once), then kills what is left."""
        with self._cond:
            self._stopping = True
        reap(self.procs, grace)


def reap(procs: list[subprocess.Popen], grace: float) -> None:
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
    for proc in procs:
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
