"""Shared by the benchmark scripts: a weightless model directory, percentiles and the roofline
bound (the workloads live in workloads.py)."""

from __future__ import annotations

import os
import sys

from minivllm.tiny_model import make_dummy_model_dir

# A GPU-only benchmark's exit code on a machine without a CUDA GPU (argparse's for bad usage).
EXIT_NO_GPU = 2


def require_cuda(prog: str, why: str, hint: str = "") -> None:
    """Exits at once, with one line on stderr naming the reason, where no CUDA GPU is visible:
    a GPU-sized benchmark on a CPU would run for hours without a line."""
    import torch

    if not torch.cuda.is_available():
        print(f"{prog}: error: needs a CUDA GPU ({why}){hint}", file=sys.stderr)
        sys.exit(EXIT_NO_GPU)


def dummy_model_dir(name: str) -> str:
    """make_dummy_model_dir into a fixed temporary folder (reused across runs)."""
    import tempfile

    return make_dummy_model_dir(name, os.path.join(tempfile.gettempdir(), f"minivllm-dummy-{name}"))


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values by nearest rank below (nan when empty)."""
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] if values else float("nan")


def model_bytes(cfg: dict, dtype_bytes: int = 2) -> tuple[int, int]:
    """(weight bytes read per decode step, KV bytes per token of context)."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd, nq, nkv, vocab = (
        cfg["head_dim"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["vocab_size"],
    )
    per_layer = h * (nq + 2 * nkv) * hd + nq * hd * h + 3 * h * inter
    weights = (layers * per_layer + vocab * h) * dtype_bytes
    kv_per_token = layers * 2 * nkv * hd * dtype_bytes
    return weights, kv_per_token


def roofline_seconds(
    cfg: dict, prompt_lens: list[int], output_lens: list[int], bandwidth: float, flops: float
) -> float:
    """Lower bound on the run: every decode step reads the weights once and every sequence's KV;
    prefill is bounded by its matmul flops. All sequences start together."""
    weights, kv_per_token = model_bytes(cfg)
    num_steps = max(output_lens)
    kv_bytes = (
        sum(o * p + o * (o + 1) // 2 for p, o in zip(prompt_lens, output_lens)) * kv_per_token
    )
    decode_s = (num_steps * weights + kv_bytes) / bandwidth
    params = weights / 2
    prefill_s = 2 * params * sum(prompt_lens) / flops
    return decode_s + prefill_s


def measure_bandwidth(device: str = "cuda") -> float:
    """Device copy bandwidth in bytes/s (read + write), from a 2 GiB copy."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    return 2 * src.numel() / seconds
