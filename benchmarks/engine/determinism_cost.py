"""What deterministic mode costs, shape by shape: each shape's benchmark run in a process of its
own, the default mode and deterministic mode alternating, `--rounds` times each; medians and the
cost in percent (time: deterministic over default, minus one). Progress lines on stderr, one
JSON line at the end.

    python -m benchmarks.engine.determinism_cost [--shapes latency,headline,long,short,prefix]
        [--rounds 2] [--timeout 300]

Shapes: `latency` is bench_latency.py (batch-1 TTFT for a 1,000-token prompt and time per output
token), the others bench_throughput.py's workloads (output tok/s; the cost is the time's).
The whole list takes ~15 minutes on an H200 at two rounds: a call of 600 s holds two or three.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# The repository's root: the benchmarks run as its modules (an uninstalled checkout too).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# shape -> (module, its arguments, {metric: True where larger is better})
SHAPES = {
    "latency": ("benchmarks.engine.bench_latency", [], {"ttft_ms": False, "tpot_ms": False}),
    **{
        name: ("benchmarks.engine.bench_throughput", ["--workload", name], {"output_tok_s": True})
        for name in ("headline", "long", "short", "prefix")
    },
}


def run_once(shape: str, deterministic: bool, timeout: float) -> dict:
    """The shape's benchmark in a fresh process: its JSON line."""
    module, args, _ = SHAPES[shape]
    cmd = [sys.executable, "-m", module, *args]
    if deterministic:
        cmd.append("--deterministic")
    # `-m` from the root: the root is first on the child's path
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def cost_pct(default: float, deterministic: float, larger_is_better: bool) -> float:
    """The deterministic run's extra time in percent of the default's."""
    ratio = default / deterministic if larger_is_better else deterministic / default
    return round((ratio - 1) * 100, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds a run")
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}: choose among {list(SHAPES)}")
    result: dict = {"bench": "determinism_cost", "rounds": args.rounds, "shapes": {}}
    for shape in shapes:
        metrics = SHAPES[shape][2]
        runs: dict[str, dict[str, list[float]]] = {
            mode: {m: [] for m in metrics} for mode in ("default", "deterministic")
        }
        for _ in range(args.rounds):
            for mode in ("default", "deterministic"):
                line = run_once(shape, mode == "deterministic", args.timeout)
                for metric in metrics:
                    runs[mode][metric].append(line[metric])
                print(shape, mode, {m: line[m] for m in metrics}, file=sys.stderr, flush=True)
        summary = {}
        for metric, larger_is_better in metrics.items():
            default = statistics.median(runs["default"][metric])
            deterministic = statistics.median(runs["deterministic"][metric])
            summary[metric] = {
                "default": runs["default"][metric],
                "deterministic": runs["deterministic"][metric],
                "cost_pct": cost_pct(default, deterministic, larger_is_better),
            }
        result["shapes"][shape] = summary
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
