"""Where the HOST time of a prefill (mixed) step goes, phase by phase: scheduler, input
preparation, copies to the device, model launch, sampling state, sampler, output handling, and
the wait for the device. Runs on CUDA (real Qwen3-0.6B shapes, dummy weights) and on the CPU
(the same 28-layer structure with tiny widths, so that a forward costs about what its ops cost
to dispatch). Each round adds one prompt and runs two engine steps (async scheduling: the
second returns the prompt's token); phases are timed inclusively without device syncs, so on
CUDA `wait_device` is where the host waits and every other phase is pure host work.
Prints one JSON line (all cases).

python benchmarks/profile_prefill_host.py [--prompt-lens 1000 4000] [--decodes 0 128]
    [--tiny-widths | --real-widths] [--sync-scheduling] [--per-op] [--cprofile 25]
    [--fake-launch]  (CPU: the CUDA path's host work with no-op Triton launches)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable

from common import dummy_model_dir

TINY_WIDTHS = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32
)


class PhaseTimer:
    """Wraps callables so that each call adds its wall time to a named phase."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: object, attr: str, phase: str) -> None:
        original = getattr(owner, attr)
        ms = self.ms

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                ms[phase] += (time.perf_counter() - start) * 1e3

        setattr(owner, attr, timed)
        if isinstance(owner, type) or attr in getattr(owner, "__dict__", {}):
            self._undo.append(lambda: setattr(owner, attr, original))
        else:
            self._undo.append(lambda: delattr(owner, attr))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def instrument(engine, timer: PhaseTimer, per_op: bool) -> None:
    """Times the phases of EngineCore.step (see the module docstring)."""
    import minivllm.engine.runner.model_runner as mr

    runner = engine.executor.runner
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.scheduler, "update", "update")  # includes wait_device and result
    timer.wrap(engine, "_execute", "execute")  # everything the runner does to launch
    timer.wrap(runner, "_update_requests", "runner_update_requests")
    timer.wrap(mr, "prepare_inputs", "prepare_inputs")
    timer.wrap(runner.prompt_logprobs, "plan", "prompt_logprobs_plan")
    timer.wrap(runner, "to_device", "to_device")
    timer.wrap(runner.model, "forward", "model_forward")
    timer.wrap(runner.model, "compute_logits", "compute_logits")
    if runner.graphs is not None:
        timer.wrap(runner.graphs, "run", "graph_replay")
    timer.wrap(runner.sampling_state, "build_metadata", "sampling_metadata")
    timer.wrap(runner.sampler, "forward", "sampler")
    timer.wrap(mr.StepHandle, "__init__", "step_handle")
    timer.wrap(mr.StepHandle, "result", "result")  # wait_device + tokens to the host
    timer.wrap(runner.sampling_state, "append_tokens", "append_tokens")
    if runner.device.type == "cuda":
        import torch

        timer.wrap(torch.cuda.Event, "synchronize", "wait_device")
    if per_op:
        seen: set[int] = set()
        for layer in runner.model.model.layers:
            for name, module in layer.named_modules():
                if not list(module.children()) and id(module) not in seen:
                    seen.add(id(module))  # rotary_emb is one module shared by every layer
                    timer.wrap(module, "forward", f"op.{name}")


def allocator_counts() -> dict[str, float]:
    """cudaMalloc/cudaFree and cudaHostAlloc counts so far (CUDA): a step that makes any of
    them may wait for the device."""
    import torch

    if not torch.cuda.is_available():
        return {}
    dev, host = torch.cuda.memory_stats(), torch.cuda.host_memory_stats()
    return {
        "count.cuda_malloc": dev.get("num_device_alloc", 0),
        "count.cuda_free": dev.get("num_device_free", 0),
        "count.cuda_host_alloc": host.get("num_host_alloc", 0),
    }


def _prompt(i: int, n: int) -> list[int]:
    return [(i * 7919 + j * 31) % 10000 for j in range(n)]


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        import torch

        torch.cuda.synchronize()


def run_case(
    engine, prompt_len: int, decodes: int, tag: int, rounds: int, top: int, per_op: bool
) -> dict:
    from minivllm import SamplingParams

    device_type = engine.executor.runner.device.type
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4 * rounds + 64)
    for i in range(decodes):
        engine.add_request(f"d{tag}-{i}", _prompt(i, 200), params)
    while len(engine.scheduler.running) < decodes or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    per_round: list[dict[str, float]] = []
    profile_text = ""
    for r in range(rounds + 1):  # round 0 warms up (kernel compiles, allocator pools)
        engine.add_request(f"p{tag}-{r}", _prompt(10_000 + tag * 100 + r, prompt_len), params)
        _sync(device_type)
        timer = PhaseTimer()
        instrument(engine, timer, per_op)
        counts = allocator_counts()
        profiler = cProfile.Profile() if top and r == rounds else None
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        first = time.perf_counter()
        engine.step()  # launches the prefill (applies the step before it)
        timer.ms["step1_total"] = (time.perf_counter() - first) * 1e3
        second = time.perf_counter()
        engine.step()  # launches the next step, applies the prefill (waits for it)
        timer.ms["step2_total"] = (time.perf_counter() - second) * 1e3
        if profiler is not None:
            profiler.disable()
        _sync(device_type)
        timer.ms["two_steps_total"] = (time.perf_counter() - start) * 1e3
        timer.restore()
        for name, value in allocator_counts().items():
            timer.ms[name] = value - counts[name]
        if r > 0:
            per_round.append(dict(timer.ms))
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
            profile_text = out.getvalue()
    for req in list(engine.scheduler.running) + list(engine.scheduler.waiting):
        engine.abort_requests([req.req_id])
    while engine.has_unfinished_requests():
        engine.step()
    if profile_text:
        print(f"--- cProfile, prompt {prompt_len}, decodes {decodes} ---", file=sys.stderr)
        print(profile_text, file=sys.stderr)
    names = sorted({name for ms in per_round for name in ms})
    phases = {n: round(statistics.median(ms.get(n, 0.0) for ms in per_round), 3) for n in names}
    return {"prompt_len": prompt_len, "decodes": decodes, "phases_ms": phases}


def model_dir(name: str, tiny_widths: bool) -> str:
    """The dummy model directory; with tiny_widths its config keeps the layer count, vocab
    and context of `name` but has tiny matrices."""
    path = dummy_model_dir(name)
    if not tiny_widths:
        return path
    tiny = path + "-tiny-widths"
    os.makedirs(tiny, exist_ok=True)
    for file in os.listdir(path):
        if file != "config.json" and not os.path.exists(os.path.join(tiny, file)):
            os.symlink(os.path.join(path, file), os.path.join(tiny, file))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f) | TINY_WIDTHS
    with open(os.path.join(tiny, "config.json"), "w") as f:
        json.dump(cfg, f)
    return tiny


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name", default="qwen3-0.6b")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--decodes", type=int, nargs="+", default=[0, 128])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cprofile", type=int, default=0, help="print the top N to stderr")
    widths = parser.add_mutually_exclusive_group()
    widths.add_argument("--tiny-widths", action="store_true", help="default on the CPU")
    widths.add_argument("--real-widths", action="store_true", help="default on CUDA")
    parser.add_argument("--per-op", action="store_true", help="time each decoder-layer op")
    parser.add_argument(
        "--fake-launch",
        action="store_true",
        help="CPU: run the CUDA path's Triton layers with no-op launches (fake_triton_launch.py)",
    )
    parser.add_argument("--sync-scheduling", action="store_true", help="async_scheduling=False")
    args = parser.parse_args()

    import torch

    from minivllm import LLM

    on_cuda = torch.cuda.is_available()
    if args.fake_launch:
        if on_cuda:
            raise SystemExit("--fake-launch is for the CPU")
        from fake_triton_launch import install_fake_launch

        install_fake_launch()
    tiny_widths = args.tiny_widths or (not on_cuda and not args.real_widths)
    max_prompt = max(args.prompt_lens)
    llm = LLM(
        model_dir(args.model_name, tiny_widths),
        load_format="dummy",
        max_model_len=max_prompt + 1024,
        max_num_batched_tokens=max(8192, max_prompt + max(args.decodes)),
        max_num_seqs=max(256, max(args.decodes) + 1),
        enable_prefix_caching=False,
        async_scheduling=not args.sync_scheduling,
        attention_backend="triton" if args.fake_launch else "auto",
    )
    cases = []
    for tag, (prompt_len, decodes) in enumerate(
        (p, d) for p in args.prompt_lens for d in args.decodes
    ):
        cases.append(
            run_case(llm.engine, prompt_len, decodes, tag, args.rounds, args.cprofile, args.per_op)
        )
    result = {
        "bench": "profile_prefill_host",
        "device": "cuda" if on_cuda else "cpu",
        "model": args.model_name + (" (tiny widths)" if tiny_widths else ""),
        "fake_launch": args.fake_launch,
        "async_scheduling": not args.sync_scheduling,
        "rounds": args.rounds,
        "cases": cases,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
