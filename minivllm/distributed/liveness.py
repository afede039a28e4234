"""Liveness of tensor-parallel ranks on other nodes, kept in the rendezvous store (the TCPStore
that node 0's rank 0 hosts at master_addr:master_port): every remote rank bumps a counter,
each node's launcher posts how a rank of its node died, and node 0 watches both.
"""

from __future__ import annotations

import atexit
import datetime
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

BEAT_INTERVAL_S = 0.5
FAILURE_KEY = "minivllm/failure"
# After a collective failed: how long to wait for a launcher's report (or for the lost rank's
# heartbeat to fall silent) that names the rank that went away.
EXPLAIN_WAIT_S = 4 * BEAT_INTERVAL_S + 1.0
# How long stopping a store thread waits for its call in flight.
STOP_WAIT_S = 2.0


def beat_key(rank: int) -> str:
    return f"minivllm/beat/{rank}"


def step_errors_key(rank: int) -> str:
    return f"minivllm/step_errors/{rank}"


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A client of the rendezvous store; waits up to timeout_s for it to come up."""
    return dist.TCPStore(
        host,
        port,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


class StoreThread:
    """A daemon thread that calls the rendezvous store: target(stopping) runs until the event
    is set. stop() sets it and waits for the store call in flight (at most STOP_WAIT_S: the
    store may be gone); an exit hook stops a thread nobody stopped. A daemon thread still
    inside a store call when the interpreter finalizes is ended under the store's C++ frames
    (CPython ends such threads with pthread_exit) and the process aborts: "terminate called
    without an active exception"."""

    def __init__(self, target: Callable[[threading.Event], None], name: str) -> None:
        self.stopping = threading.Event()
        self._thread = threading.Thread(
            target=target, args=(self.stopping,), name=name, daemon=True
        )
        self._thread.start()
        atexit.register(self.stop)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self.stopping.set()
        atexit.unregister(self.stop)
        if self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT_S)


def start_heartbeat(store: dist.Store, rank: int, on_lost: Callable[[str], None]) -> StoreThread:
    """Bumps this rank's counter every BEAT_INTERVAL_S until stopped; calls on_lost once (and
    stops) when the store is gone, which means node 0's rank 0 is gone."""

    def beat(stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                store.add(beat_key(rank), 1)
            except Exception as e:  # the store lives in node 0's engine process
                if not stopping.is_set():
                    on_lost(f"lost node 0 (rank 0, the rendezvous store): {type(e).__name__}: {e}")
                return
            stopping.wait(BEAT_INTERVAL_S)

    return StoreThread(beat, "minivllm-heartbeat")


class NodeMonitor:
    """Node 0's watch over the ranks of the other nodes. `failure` stays None while they are
    alive; it becomes a message naming the rank and node when a launcher posts a death or a
    rank's counter stops moving for timeout_s. on_failure runs once, on the watch thread."""

    def __init__(
        self,
        store: dist.Store,
        rank_to_node: dict[int, int],
        timeout_s: float,
        on_failure: Callable[[], None],
    ) -> None:
        self.failure: str | None = None
        self._store = store
        self._lock = threading.Lock()  # one store client, used by the watch and the caller
        self._nodes = rank_to_node
        self._timeout_s = timeout_s
        self._on_failure = on_failure
        now = time.monotonic()
        self._beats = {rank: (-1, now) for rank in rank_to_node}  # rank -> (count, changed at)
        self._thread = StoreThread(self._watch, "minivllm-node-monitor")

    def _watch(self, stopping: threading.Event) -> None:
        while not stopping.wait(BEAT_INTERVAL_S):
            try:
                failure = self._poll()
            except Exception as e:
                failure = f"the rendezvous store failed: {type(e).__name__}: {e}"
            if failure is not None and not stopping.is_set():
                self.failure = failure + "; the engine cannot continue, start it again"
                self._on_failure()
                self._post(failure)
                return

    def _poll(self) -> str | None:
        with self._lock:
            if self._store.check([FAILURE_KEY]):
                return self._store.get(FAILURE_KEY).decode()
            counts = {rank: self._store.add(beat_key(rank), 0) for rank in self._beats}
        now = time.monotonic()
        for rank, count in counts.items():
            last, since = self._beats[rank]
            if count != last:
                self._beats[rank] = (count, now)
            elif now - since > self._timeout_s:
                return (
                    f"tensor-parallel rank {rank} on node {self._nodes[rank]} sent no heartbeat "
                    f"for {self._timeout_s:.0f} s (the node is down, hung or cut off)"
                )
        return None

    def _post(self, failure: str) -> None:
        """Tells every node's launcher (they stop their ranks) unless one posted it."""
        try:
            with self._lock:
                self._store.compare_set(FAILURE_KEY, "", failure)
        except Exception:
            pass

    def explain(self) -> str | None:
        """After a collective failed: which watched rank is gone, or None if none seems to be.
        Waits up to EXPLAIN_WAIT_S for a launcher's report or a heartbeat that stopped."""
        deadline = time.monotonic() + EXPLAIN_WAIT_S
        while time.monotonic() < deadline:
            if self.failure is not None:
                return self.failure
            time.sleep(0.05)
        silent_for = EXPLAIN_WAIT_S - 1.0
        now = time.monotonic()
        silent = sorted(r for r, (_, since) in self._beats.items() if now - since >= silent_for)
        if not silent:
            return None
        names = ", ".join(f"rank {r} on node {self._nodes[r]}" for r in silent)
        return (
            f"lost tensor-parallel {names}: no heartbeat for {silent_for:.0f} s; the engine "
            "cannot continue, start it again"
        )

    def num_step_errors(self) -> int:
        """How many failed steps every remote rank has reported so far."""
        with self._lock:
            return min(self._store.add(step_errors_key(r), 0) for r in self._nodes)

    def stop(self) -> None:
        self._thread.stop()
