"""Cost of the engine-core transport (pickle over a socket pair, multiprocessing Connection).

Measures, between two processes: the round trip of one step message (N EngineOutputs of one
token each, plus EngineStats), and one ADD message of N requests with P-token prompts.
Prints one JSON line.

python -m benchmarks.cpu.bench_transport [--batch 128] [--prompt-len 1000] [--iters 2000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pickle
import time
from multiprocessing.connection import Connection

from minivllm.engine.client.protocol import MessageKind
from minivllm.engine.stats import EngineStats
from minivllm.engine.types import EngineOutput, EngineRequest
from minivllm.sampling_params import SamplingParams


def _echo(conn: Connection) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(("ack",))


def _step_message(batch: int) -> tuple:
    outputs = [EngineOutput(req_id=f"cmpl-{i:032x}", new_token_ids=[1234]) for i in range(batch)]
    # As core_process sends them: field tuples (dataclasses pickle ~4x slower).
    return (MessageKind.OUTPUTS, [tuple(o.__dict__.values()) for o in outputs], EngineStats())


def _add_message(batch: int, prompt_len: int) -> tuple:
    params = SamplingParams(temperature=0.0, max_tokens=200)
    requests = []
    for i in range(batch):  # distinct prompts: pickle would share one list
        prompt = list(range(1000 + i, 1000 + i + prompt_len))
        requests.append(EngineRequest(f"cmpl-{i:032x}", prompt, params, time.time()))
    return (MessageKind.ADD, requests)


def _round_trip_us(conn: Connection, msg: tuple, iters: int) -> float:
    for _ in range(10):
        conn.send(msg)
        conn.recv()
    start = time.perf_counter()
    for _ in range(iters):
        conn.send(msg)
        conn.recv()
    return 1e6 * (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    # Pipe(duplex=True) is a socket pair wrapped in Connections: the transport of the core.
    ctx = mp.get_context("spawn")
    conn, theirs = ctx.Pipe(duplex=True)
    child = ctx.Process(target=_echo, args=(theirs,))
    child.start()
    empty = ("abort", [])
    step = _step_message(args.batch)
    add = _add_message(args.batch, args.prompt_len)
    start = time.perf_counter()
    for _ in range(args.iters):
        pickle.dumps(step)
    encode_us = 1e6 * (time.perf_counter() - start) / args.iters
    result = {
        "bench": "transport",
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "empty_round_trip_us": _round_trip_us(conn, empty, args.iters),
        "step_message_bytes": len(pickle.dumps(step)),
        "step_pickle_us": encode_us,
        "step_round_trip_us": _round_trip_us(conn, step, args.iters),
        "add_message_bytes": len(pickle.dumps(add)),
        "add_round_trip_us": _round_trip_us(conn, add, max(args.iters // 20, 10)),
    }
    conn.send(None)
    child.join()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
