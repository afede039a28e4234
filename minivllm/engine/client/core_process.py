"""The engine-core process: runs EngineCore.step() in a loop, fed over one socket.

Started by core_client.EngineCoreClient as `python -m minivllm.engine.client.core_process --fd N`
(its own entry point: it never imports the user's script). Messages are pickled tuples that
start with a MessageKind (engine/client/protocol.py):

  in:  (CONFIG, EngineConfig, ModelConfig) once, then (ADD, [EngineRequest]),
       (ABORT, [req_id]), (CHECK_GRAMMAR, check_id, StructuredOutputSpec, refuse_when_busy),
       (SHUTDOWN,)
  out: (READY, CoreInfo) | (FAILED, is_user_error, message) once, then one
       (OUTPUTS, [EngineOutput fields as a tuple], EngineStats) per step,
       (REJECTED, req_id, message) for a request the scheduler refuses (an id in use),
       (GRAMMAR_CHECKED, check_id, CheckOutcome) once each check's compile has ended (sent
       from the compile's thread: sends are serialized by a lock), and
       (DEAD, message) before exiting on a failed step

Requests come validated by the frontend (request_checks.check_request): none is checked here.

End of file on the socket means the parent is gone: the process exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback
from concurrent.futures import Future
from multiprocessing.connection import Connection

from minivllm.config import EngineConfig
from minivllm.engine.client.protocol import MessageKind
from minivllm.engine.engine_core import EngineCore
from minivllm.models.model_config import ModelConfig

logger = logging.getLogger("minivllm.core")

# Test hook (fault injection): step number at which step() raises.
FAULT_ENV = "MINIVLLM_FAULT_AT_STEP"
# Benchmark hook: "module:Class" of an EngineCore stand-in (benchmarks/cpu/bench_frontend_cpu.py
# measures the frontend with a core whose steps cost nothing).
CORE_FACTORY_ENV = "MINIVLLM_CORE_FACTORY"


def _make_core(config: EngineConfig, model_config: ModelConfig) -> EngineCore:
    factory = os.environ.get(CORE_FACTORY_ENV)
    if not factory:
        return EngineCore(config, model_config)
    import importlib

    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)(config, model_config)


class _Shutdown(Exception):
    pass


class _Channel:
    """The socket to the frontend, its sends serialized: the step loop sends outputs while a
    compile's thread sends a grammar check's answer."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()

    def send(self, msg: tuple) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def recv(self) -> tuple:
        return self._conn.recv()

    def poll(self, timeout: float | None) -> bool:
        return self._conn.poll(timeout)


def _answer_check(conn: _Channel, check_id: int, outcome: Future) -> None:
    try:
        conn.send((MessageKind.GRAMMAR_CHECKED, check_id, outcome.result()))
    except OSError:
        pass  # the frontend is gone: the loop sees the end of file


def _handle(core: EngineCore, conn: _Channel, msg: tuple) -> None:
    kind = msg[0]
    if kind is MessageKind.ADD:
        for request in msg[1]:
            try:
                core.add_requests([request])
            except ValueError as e:
                conn.send((MessageKind.REJECTED, request.req_id, str(e)))
    elif kind is MessageKind.ABORT:
        core.abort_requests(msg[1])
    elif kind is MessageKind.CHECK_GRAMMAR:
        _, check_id, spec, refuse_when_busy = msg
        outcome = core.check_grammar(spec, refuse_when_busy)
        outcome.add_done_callback(lambda done: _answer_check(conn, check_id, done))
    elif kind is MessageKind.SHUTDOWN:
        raise _Shutdown
    else:
        raise RuntimeError(f"unknown message {kind!r}")


def run_loop(core: EngineCore, conn: _Channel) -> None:
    """Drains adds and aborts, steps while there is work, sends one message per step."""
    fault_at = int(os.environ.get(FAULT_ENV, "0"))
    num_steps = 0
    while True:
        if not core.has_unfinished_requests():
            conn.poll(None)  # idle: sleep until a message (or EOF) arrives
        num_messages = 0
        while conn.poll(0):
            _handle(core, conn, conn.recv())  # EOFError: the parent is gone
            num_messages += 1
        if core.has_unfinished_requests():
            num_steps += 1
            if num_steps == fault_at:
                raise RuntimeError(f"injected fault at step {num_steps} ({FAULT_ENV})")
            outputs = core.step()
            # Field tuples pickle ~4x faster than dataclasses: this is the core's hot path.
            outputs = [tuple(o.__dict__.values()) for o in outputs]
            conn.send((MessageKind.OUTPUTS, outputs, core.stats()))
        elif num_messages:
            conn.send((MessageKind.OUTPUTS, [], core.stats()))  # aborts changed the gauges


def serve(connection: Connection) -> int:
    conn = _Channel(connection)
    kind, *payload = conn.recv()
    if kind is not MessageKind.CONFIG:
        raise RuntimeError(f"expected the config first, got {kind!r}")
    try:
        core = _make_core(*payload)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        is_user_error = isinstance(e, (ValueError, TypeError))
        if not is_user_error:
            logger.exception("engine core failed to start")
        conn.send((MessageKind.FAILED, is_user_error, f"{type(e).__name__}: {e}"))
        return 1
    conn.send((MessageKind.READY, core.info))
    try:
        run_loop(core, conn)
    except (_Shutdown, EOFError, BrokenPipeError, ConnectionResetError):
        return 0
    except Exception as e:  # noqa: BLE001 - a failed step ends every request with an error
        logger.error("engine core step failed:\n%s", traceback.format_exc())
        try:
            conn.send((MessageKind.DEAD, f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        return 1
    finally:
        core.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="inherited socket fd")
    args = parser.parse_args(argv)
    # Ctrl-C (and a SIGTERM to the process group) reaches the core too; the server decides
    # when it stops: it closes the socket, and EOF ends this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    conn = Connection(args.fd)
    try:
        return serve(conn)
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
