"""Sizes the KV cache on CUDA: a dummy forward at the largest token budget, peak memory read,
and `gpu_memory_utilization` of the card minus what this engine uses otherwise given to the
cache (vLLM's meaning: the fraction is this engine's share, other processes do not shrink it)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence

import torch

from minivllm.engine.runner.block_table import BlockTable
from minivllm.engine.runner.cache.kv_cache import KVCacheSpec, bind_kv_caches
from minivllm.engine.runner.input_prep import StepInputs, prepare_inputs
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData, ScheduledChunk, SchedulerOutput
from minivllm.layers.attention import Attention
from minivllm.layers.sampler import Sampler
from minivllm.layers.sampling_filters import TOP_K_CAP
from minivllm.sampling_params import SamplingParams

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


def sample_worst_case(
    sampling_state: SamplingState, sampler: Sampler, logits: torch.Tensor, max_logprobs: int
) -> None:
    """Samples logits' rows as the options with the largest workspaces would: every row with
    the three penalties, min_tokens and the most logprobs allowed, once with top-p alone (the
    sort fallback), once with top-k at the Triton thresholds' cap (where the sampler has them)
    and once at the torch candidates' cap; min_tokens' bans make every step an edited float32
    copy (penalties alone are read by the Triton kernels without one). Profiling runs it after
    the forward, so the peak it reads holds the sampler's workspace."""
    num_rows, vocab_size = logits.shape
    num_logprobs = vocab_size if max_logprobs == -1 else min(max_logprobs, vocab_size)
    for top_k in sorted({0, sampler.kernel_top_k_cap, TOP_K_CAP}):
        params = SamplingParams(
            temperature=0.7, top_k=top_k, top_p=0.9, min_p=0.05, repetition_penalty=1.05,
            frequency_penalty=0.1, presence_penalty=0.1, min_tokens=1, stop_token_ids=[0],
            logprobs=num_logprobs or None, seed=0,
        )  # fmt: skip
        req_ids = [f"profile-{row}" for row in range(num_rows)]
        for req_id in req_ids:
            sampling_state.add_request(NewRequestData(req_id, [0], params))
        try:
            meta = sampling_state.build_metadata(req_ids)
            out = sampler(logits, meta)  # in place, as a step samples its logits
            sampling_state.record_sampled(meta, out.sampled_token_ids)
        finally:
            for req_id in req_ids:
                sampling_state.remove(req_id)


def measure_graph_bytes(capture: Callable[[], object]) -> int:
    """The device memory that the CUDA graphs `capture` makes hold (their static buffers and
    private memory pool), measured by capturing them and releasing them again."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    graphs = capture()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # returns cached blocks; a live graph's pool stays
    held = torch.cuda.memory_reserved() - before
    del graphs
    gc.collect()
    torch.cuda.empty_cache()
    return max(held, 0)


def memory_baseline(device: torch.device, gpu_memory_utilization: float) -> int:
    """Bytes in use on `device` before this engine loads anything (other processes, engines
    already alive in this one). The engine's share must be free now: else a clear error, as
    in vLLM, rather than a KV cache that turns out empty."""
    # An engine dropped just before this one may still sit in a reference cycle: collect it.
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    wanted = int(total * gpu_memory_utilization)
    if free < wanted:
        raise ValueError(
            f"free memory on {device} ({free / 2**30:.1f} of {total / 2**30:.1f} GiB) is less"
            f" than gpu_memory_utilization={gpu_memory_utilization} asks for"
            f" ({wanted / 2**30:.1f} GiB): lower gpu_memory_utilization or free the GPU"
        )
    return total - free


def profile_kv_budget(
    run_model: Callable[[StepInputs], tuple[torch.Tensor, torch.Tensor | None]],
    attention_layers: Sequence[Attention],
    kv_spec: KVCacheSpec,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    gpu_memory_utilization: float,
    baseline_used: int,
    run_sampler: Callable[[torch.Tensor], None],
    reserved_bytes: int,
    capture_graphs: Callable[[], object] | None = None,
) -> int:
    """Returns the bytes the KV cache may take on this rank's GPU.

    run_model runs the model over a step's inputs (ModelRunner.run_model); the layers get a
    throwaway cache just large enough for the dummy step, unbound again afterwards.
    baseline_used: memory_baseline() taken before the weights were loaded. run_sampler
    samples the step's logits at the sampler's largest workspace (sample_worst_case).
    reserved_bytes: what the runner's per-request structures outside the dummy step may take
    (pooling_reserve_bytes), kept out of the budget.
    capture_graphs (None: no CUDA graphs) captures the largest graph of each kind on the
    throwaway cache; what they hold is kept out of the budget, as the graphs captured after
    the cache is allocated will hold as much.
    """
    num_seqs = min(max_num_seqs, max_num_batched_tokens)
    sched_out = dummy_step(max_num_batched_tokens, num_seqs, max_model_len, kv_spec.block_size)
    num_blocks = sum(len(c.new_block_ids) for c in sched_out.chunks)
    max_blocks = -(-max_model_len // kv_spec.block_size)
    inputs = prepare_inputs(sched_out, kv_spec.block_size, BlockTable(max_blocks, num_seqs))

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info()
    allocated_before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    caches = kv_spec.allocate(num_blocks)
    cache_bytes = num_blocks * kv_spec.bytes_per_block
    bind_kv_caches(attention_layers, caches)
    logits, _ = run_model(inputs)
    run_sampler(logits)
    torch.cuda.synchronize()
    peak_activation = torch.cuda.max_memory_allocated() - allocated_before - cache_bytes
    del logits
    graph_bytes = 0 if capture_graphs is None else measure_graph_bytes(capture_graphs)
    bind_kv_caches(attention_layers, [torch.empty(0)] * len(caches))
    del caches
    torch.cuda.empty_cache()

    # used_by_engine: weights and whatever else this engine allocated since the baseline.
    used_by_engine = total - free_before - baseline_used
    budget = int(total * gpu_memory_utilization) - used_by_engine - peak_activation
    budget -= graph_bytes + reserved_bytes
    logger.info(
        "memory profile: total %.1f GiB, in use by others %.2f GiB, by this engine %.2f GiB,"
        " activation peak %.2f GiB, CUDA graphs %.2f GiB, pooling state %.2f GiB"
        " -> KV cache %.2f GiB",
        total / 2**30,
        baseline_used / 2**30,
        used_by_engine / 2**30,
        peak_activation / 2**30,
        graph_bytes / 2**30,
        reserved_bytes / 2**30,
        budget / 2**30,
    )
    return max(budget, 0)
