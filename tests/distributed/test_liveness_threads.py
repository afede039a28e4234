"""The liveness threads (distributed/liveness.py) call the rendezvous store from daemon threads.
A daemon thread still inside such a call when the interpreter finalizes is ended under the
store's C++ frames and the process aborts ("terminate called without an active exception"):
stop() ends and joins them, and whatever nobody stopped is stopped at exit, before the
interpreter finalizes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import torch.distributed as dist

from minivllm.distributed.liveness import NodeMonitor, beat_key, start_heartbeat
from minivllm.engine.executor.tp_executor import free_port

SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading, time
    import torch.distributed as dist
    from minivllm.distributed.liveness import NodeMonitor, start_heartbeat

    def report():  # registered first, so it runs after the liveness objects' own exit hooks
        names = {t.name for t in threading.enumerate()}
        print("LEFT", sorted(n for n in names if n.startswith("minivllm-")), flush=True)

    atexit.register(report)
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False)
    start_heartbeat(store, 1, on_lost=print)
    NodeMonitor(store, {1: 1}, 30.0, on_failure=lambda: None)
    time.sleep(1.2)  # a few beats; then exit without stopping either
    """
)


def test_stop_ends_and_joins_the_threads() -> None:
    store = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
    heartbeat = start_heartbeat(store, 3, on_lost=lambda message: None)
    monitor = NodeMonitor(store, {3: 1}, 30.0, on_failure=lambda: None)
    heartbeat.stop()
    monitor.stop()
    assert not heartbeat.is_alive() and not monitor._thread.is_alive()
    beats = store.add(beat_key(3), 0)
    assert beats >= 1
    threading.Event().wait(0.7)  # longer than a beat
    assert store.add(beat_key(3), 0) == beats  # no beat after stop()


def test_threads_nobody_stopped_are_stopped_before_the_interpreter_finalizes() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LEFT []" in out.stdout, out.stdout + out.stderr[-2000:]
