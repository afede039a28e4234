"""The engine-core process: runs EngineCore.step() in a loop, fed over one socket.

Started by core_client.EngineCoreClient as `python -m minivllm.engine.client.core_process --fd N`
(its own entry point: it never imports the user's script). Messages are pickled tuples:

  in:  ("config", EngineConfig) once, then ("add", [(req_id, prompt_ids, params, arrival)]),
       ("abort", [req_id]), ("shutdown",)
  out: ("ready", CoreInfo) | ("failed", is_user_error, message) once, then one
       ("outputs", [EngineOutput fields as a tuple], EngineStats) per step,
       ("rejected", req_id, message), and ("dead", message) before exiting on a failed step

End of file on the socket means the parent is gone: the process exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection

from minivllm.engine.engine_core import EngineCore

logger = logging.getLogger("minivllm.core")

# Test hook (issue 11's fault injection): step number at which step() raises.
FAULT_ENV = "MINIVLLM_FAULT_AT_STEP"
# Benchmark hook: "module:Class" of an EngineCore stand-in (benchmarks/bench_frontend_cpu.py
# measures the frontend with a core whose steps cost nothing).
CORE_FACTORY_ENV = "MINIVLLM_CORE_FACTORY"


def _make_core(config) -> EngineCore:
    factory = os.environ.get(CORE_FACTORY_ENV)
    if not factory:
        return EngineCore(config)
    import importlib

    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)(config)


class _Shutdown(Exception):
    pass


def _handle(core: EngineCore, conn: Connection, msg: tuple) -> None:
    kind = msg[0]
    if kind == "add":
        for req_id, prompt_token_ids, params, arrival in msg[1]:
            try:
                core.add_request(req_id, prompt_token_ids, params, arrival)
            except (ValueError, TypeError) as e:
                conn.send(("rejected", req_id, str(e)))
    elif kind == "abort":
        core.abort_requests(msg[1])
    elif kind == "shutdown":
        raise _Shutdown
    else:
        raise RuntimeError(f"unknown message {kind!r}")


def run_loop(core: EngineCore, conn: Connection) -> None:
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
            conn.send(("outputs", [tuple(o.__dict__.values()) for o in outputs], core.stats()))
        elif num_messages:
            conn.send(("outputs", [], core.stats()))  # aborts changed the gauges


def serve(conn: Connection) -> int:
    kind, config = conn.recv()
    if kind != "config":
        raise RuntimeError(f"expected the config first, got {kind!r}")
    try:
        core = _make_core(config)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        is_user_error = isinstance(e, (ValueError, TypeError))
        if not is_user_error:
            logger.exception("engine core failed to start")
        conn.send(("failed", is_user_error, f"{type(e).__name__}: {e}"))
        return 1
    conn.send(("ready", core.info))
    try:
        run_loop(core, conn)
    except (_Shutdown, EOFError, BrokenPipeError, ConnectionResetError):
        return 0
    except Exception as e:  # noqa: BLE001 - a failed step ends every request with an error
        logger.error("engine core step failed:\n%s", traceback.format_exc())
        try:
            conn.send(("dead", f"{type(e).__name__}: {e}"))
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
