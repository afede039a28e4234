"""The scheduler's limits (max_num_seqs, max_num_batched_tokens): the user's values, or
defaults chosen once at engine build (engine/setup.py reads the device) from the device's
memory and the usage (offline or server), following vLLM 0.20's rule
(EngineArgs.get_batch_defaults)."""

from __future__ import annotations

from typing import Literal, NamedTuple

Usage = Literal["offline", "server"]

# H100/H200-class cards: enough memory that 1024 sequences in flight still leave a large cache.
LARGE_GPU_BYTES = 70 * 2**30


class SchedulerLimits(NamedTuple):
    max_num_seqs: int
    max_num_batched_tokens: int


def auto_scheduler_limits(
    total_memory: int, device_type: str, usage: Usage, device_name: str = ""
) -> SchedulerLimits:
    """Defaults for a device with total_memory bytes.

    - CPU: 256 and 8192 (steps are slow there; bigger batches only add latency).
    - GPU with >= 70 GiB (not A100: vLLM measured a 16k token budget slower there): 1024
      sequences; 16384 tokens a step offline, 8192 for the server, whose shorter mixed steps
      keep the inter-token latency of running requests down while prompts prefill.
    - Smaller GPUs: 256 sequences; 8192 tokens offline, 2048 for the server.
    """
    if usage not in ("offline", "server"):
        raise ValueError(f"usage must be offline|server, got {usage!r}")
    if device_type != "cuda":
        return SchedulerLimits(256, 8192)
    if total_memory >= LARGE_GPU_BYTES and "a100" not in device_name.lower():
        return SchedulerLimits(1024, 16384 if usage == "offline" else 8192)
    return SchedulerLimits(256, 8192 if usage == "offline" else 2048)
