"""Sizes the KV cache on CUDA: a dummy forward at the largest token budget, peak memory read,
and `gpu_memory_utilization` of the card minus everything else given to the cache."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence

import torch

from minivllm.engine.block_table import BlockTable
from minivllm.engine.input_prep import StepInputs, prepare_inputs
from minivllm.engine.kv_cache import KVCacheSpec, bind_kv_caches
from minivllm.engine.types import ScheduledChunk, SchedulerOutput
from minivllm.layers.attention import Attention

logger = logging.getLogger(__name__)


def dummy_step(
    num_tokens: int, num_seqs: int, max_model_len: int, block_size: int
) -> SchedulerOutput:
    """num_tokens prompt tokens over num_seqs sequences, each on its own blocks, all sampled."""
    num_seqs = max(num_seqs, -(-num_tokens // max_model_len))
    base, extra = divmod(num_tokens, num_seqs)
    chunks, next_block = [], 0
    for i in range(num_seqs):
        n = base + (1 if i < extra else 0)
        num_blocks = -(-n // block_size)
        block_ids = list(range(next_block, next_block + num_blocks))
        chunks.append(ScheduledChunk(f"profile-{i}", [0] * n, 0, block_ids, 0, True))
        next_block += num_blocks
    return SchedulerOutput(chunks=[c for c in chunks if c.token_ids], num_decode_chunks=0)


def profile_kv_budget(
    run_model: Callable[[StepInputs], torch.Tensor],
    attention_layers: Sequence[Attention],
    kv_spec: KVCacheSpec,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    gpu_memory_utilization: float,
) -> int:
    """Returns the bytes the KV cache may take on this rank's GPU.

    run_model runs the model over a step's inputs (ModelRunner.run_model); the layers get a
    throwaway cache just large enough for the dummy step, unbound again afterwards.
    """
    num_seqs = min(max_num_seqs, max_num_batched_tokens)
    sched_out = dummy_step(max_num_batched_tokens, num_seqs, max_model_len, kv_spec.block_size)
    num_blocks = sum(len(c.new_block_ids) for c in sched_out.chunks)
    max_blocks = -(-max_model_len // kv_spec.block_size)
    inputs = prepare_inputs(sched_out, kv_spec.block_size, BlockTable(max_blocks, num_seqs))

    # An engine dropped just before this one may still sit in a reference cycle: collect it,
    # or its memory counts as used elsewhere and shrinks this engine's KV cache.
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info()
    allocated_before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    caches = kv_spec.allocate(num_blocks)
    cache_bytes = num_blocks * kv_spec.bytes_per_block
    bind_kv_caches(attention_layers, caches)
    logits = run_model(inputs)
    torch.cuda.synchronize()
    # Top-p sorting and softmax take a few float32 copies of the logits on top.
    sampler_bytes = 4 * logits.shape[0] * logits.shape[1] * 4
    peak_activation = (
        torch.cuda.max_memory_allocated() - allocated_before - cache_bytes + sampler_bytes
    )
    bind_kv_caches(attention_layers, [torch.empty(0)] * len(caches))
    del caches, logits
    torch.cuda.empty_cache()

    # used_elsewhere: weights, the CUDA context, other processes.
    used_elsewhere = total - free_before
    budget = int(total * gpu_memory_utilization) - used_elsewhere - peak_activation
    logger.info(
        "memory profile: total %.1f GiB, in use %.2f GiB, activation peak %.2f GiB"
        " -> KV cache %.2f GiB",
        total / 2**30,
        used_elsewhere / 2**30,
        peak_activation / 2**30,
        budget / 2**30,
    )
    return max(budget, 0)
