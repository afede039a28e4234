"""Shared by the benchmark scripts: a weightless model directory, percentiles and the roofline
bound (the workloads live in workloads.py)."""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

import torch

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.engine.runner.cache.state_cache import RecurrentStateSpec
from minivllm.layers.fused_moe import FusedMoE
from minivllm.models.model_config import ModelConfig
from minivllm.models.registry import get_model_class
from minivllm.tiny_model import make_dummy_model_dir

# A GPU-only benchmark's exit code on a machine without a CUDA GPU (argparse's for bad usage).
EXIT_NO_GPU = 2


def require_cuda(prog: str, why: str, hint: str = "") -> None:
    """Exits at once, with one line on stderr naming the reason, where no CUDA GPU is visible:
    a GPU-sized benchmark on a CPU would run for hours without a line."""
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


class ModelBytes(NamedTuple):
    """A model's bytes at `dtype_bytes` a weight, counted on the model minivllm builds."""

    weights: int  # every parameter: what the weights take in memory
    dense_read: int  # read by every decode step: all but the routed experts and the
    # input embedding table (a step reads only its tokens' rows; a tied table is the LM head)
    expert: int  # one routed expert's weights, summed over the sparse layers
    num_experts: int  # routed experts a sparse layer (0: a dense model)
    top_k: int  # experts a token
    kv_per_token: int  # paged KV of one context token, over the full-attention layers
    state_per_seq: int  # one sequence's recurrent state (Gated DeltaNet layers)
    dtype_bytes: int  # a weight's, as counted

    @property
    def active(self) -> int:
        """Weights one token reads: the dense part and its top_k experts a layer."""
        return self.dense_read + self.top_k * self.expert

    def read_per_step(self, num_seqs: int) -> int:
        """Weights a decode step of num_seqs tokens reads: the experts it is expected to touch
        where each token picks top_k of num_experts uniformly (top_k at 1 token, nearly all
        of them at hundreds)."""
        if not self.num_experts:
            return self.dense_read
        touched = self.num_experts * (1 - (1 - self.top_k / self.num_experts) ** num_seqs)
        return self.dense_read + round(touched * self.expert)


def model_bytes(cfg: dict, dtype_bytes: int = 2) -> ModelBytes:
    """The bytes of the model of config.json `cfg` (dense, MoE, hybrid; a `text_config` is
    read as the engine reads it), from its parameters built on the meta device: the whole
    model, so before this process joins a tensor-parallel group (its layers would be one
    rank's)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise RuntimeError("model_bytes counts the whole model: call it before the engine starts")
    config = ModelConfig.from_dict(cfg)
    with torch.device("meta"):
        model = get_model_class(config.architecture)(
            config, TorchSDPABackend(), dtype=torch.bfloat16, use_triton=False
        )
    total = sum(p.numel() for p in model.parameters())
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    expert_total = sum(p.numel() for m in experts for p in m.parameters())
    embedding = 0 if config.tie_word_embeddings else model.model.embed_tokens.weight.numel()
    moe = config.moe
    state = RecurrentStateSpec.for_model(config, torch.bfloat16, torch.device("meta"))
    return ModelBytes(
        weights=total * dtype_bytes,
        dense_read=(total - expert_total - embedding) * dtype_bytes,
        expert=expert_total // moe.num_experts * dtype_bytes if experts else 0,
        num_experts=moe.num_experts if experts else 0,
        top_k=moe.num_experts_per_tok if experts else 0,
        kv_per_token=config.num_kv_layers * 2 * config.num_key_value_heads * config.head_dim
        * dtype_bytes,
        state_per_seq=0 if state is None else state.bytes_per_slot,
        dtype_bytes=dtype_bytes,
    )  # fmt: skip


def roofline_seconds(
    sizes: ModelBytes,
    prompt_lens: list[int],
    output_lens: list[int],
    bandwidth: float,
    flops: float,
) -> float:
    """The run's roofline on the model of `sizes` (model_bytes), all sequences starting
    together: each decode step reads the weights of the running sequences' tokens
    (ModelBytes.read_per_step: all a dense model's, the experts a MoE's is expected to touch),
    every sequence's KV, and reads and writes its recurrent state; prefill is bounded by its
    matmul flops (two a weight a token touches)."""
    decode_bytes = 0
    for step in range(max(output_lens)):
        # Each running sequence's context, its new token included.
        context = [p + step + 1 for p, o in zip(prompt_lens, output_lens) if o > step]
        decode_bytes += sizes.read_per_step(len(context))
        decode_bytes += sum(context) * sizes.kv_per_token + 2 * len(context) * sizes.state_per_seq
    prefill_s = 2 * sizes.active / sizes.dtype_bytes * sum(prompt_lens) / flops
    return decode_bytes / bandwidth + prefill_s


def measure_bandwidth(device: str = "cuda") -> float:
    """Device copy bandwidth in bytes/s (read + write), from a 2 GiB copy."""
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
