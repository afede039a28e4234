"""HybridKVCoordinator: a state slot per request beside its blocks, handed out with the first
blocks, given back on free; no prefix-cache hits without snapshot slots (hits:
test_state_snapshots.py); running out of either changes nothing. And the engine's KV budget on
the CPU counts the state pool, snapshots included, before it sizes the blocks."""

from __future__ import annotations

import dataclasses

from minivllm import LLM
from minivllm.engine.runner.cache.kv_cache import KVCacheSpec
from minivllm.engine.runner.cache.state_budget import SNAPSHOT_SHARE, state_budget_for
from minivllm.engine.runner.cache.state_cache import RecurrentStateSpec
from minivllm.engine.sched.kv.kv_coordinator import HybridKVCoordinator
from minivllm.engine.sched.request import Request
from minivllm.models.model_config import ModelConfig
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


def make_request(req_id: str, num_tokens: int) -> Request:
    return Request(req_id, list(range(1, num_tokens + 1)), SamplingParams(), 0.0)


def allocate(coordinator: HybridKVCoordinator, request: Request, num_new_tokens: int):
    new_block_ids = coordinator.allocate_slots(request, num_new_tokens)
    if new_block_ids is not None:
        request.block_ids += new_block_ids
        request.num_computed_tokens += num_new_tokens
    return new_block_ids


def test_slots_follow_requests() -> None:
    coordinator = HybridKVCoordinator(num_blocks=8, block_size=BLOCK_SIZE, num_state_slots=2)
    a, b, c = (make_request(name, 6) for name in "abc")
    assert allocate(coordinator, a, 4) == [0] and a.state_slot == 0
    assert allocate(coordinator, a, 2) == [1] and a.state_slot == 0  # keeps its slot
    assert allocate(coordinator, b, 6) == [2, 3] and b.state_slot == 1
    # No slot left: c gets nothing, and no block is taken.
    assert allocate(coordinator, c, 6) is None
    assert c.state_slot == -1 and coordinator.num_free_blocks == 4
    coordinator.free(a)  # finished or preempted: its slot comes back
    assert a.state_slot == -1 and coordinator.num_free_state_slots == 1
    assert allocate(coordinator, c, 6) is not None and c.state_slot == 0


def test_no_blocks_keeps_the_slot_free() -> None:
    coordinator = HybridKVCoordinator(num_blocks=2, block_size=BLOCK_SIZE, num_state_slots=2)
    request = make_request("a", 12)
    assert allocate(coordinator, request, 12) is None
    assert request.state_slot == -1 and coordinator.num_free_state_slots == 2


def test_no_prefix_hits() -> None:
    coordinator = HybridKVCoordinator(num_blocks=8, block_size=BLOCK_SIZE, num_state_slots=2)
    first, second = make_request("a", 9), make_request("b", 9)
    allocate(coordinator, first, 9)
    assert coordinator.get_computed_blocks(second) == ([], 0)


def _cpu_llm(model_dir: str, budget: int, max_num_seqs: int, prefix_caching: bool = False) -> LLM:
    """Without prefix caching unless asked: no snapshot slots in the pool."""
    return LLM(
        model_dir, dtype="float32", device="cpu", block_size=BLOCK_SIZE,
        kv_cache_memory=budget, max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching,
    )  # fmt: skip


def _spec_bytes(model_dir: str, llm: LLM) -> tuple[int, int]:
    """(bytes of a KV block, bytes of a state slot) of the tiny Qwen3.5."""
    config = ModelConfig.from_hf(model_dir)
    dtype = llm.engine.setup.dtype
    states = RecurrentStateSpec.for_model(config, dtype, "cpu")
    kv = KVCacheSpec.for_model(config, BLOCK_SIZE, dtype, "cpu", 1)
    assert kv.num_layers == 1 and states.num_layers == 3
    return kv.bytes_per_block, states.bytes_per_slot


def test_cpu_budget_counts_the_state_pool(tiny_qwen3_5_dir: str) -> None:
    """8 seats take well under a quarter of 1 MiB: 8 slots, the rest is KV."""
    budget, max_num_seqs = 1 << 20, 8
    llm = _cpu_llm(tiny_qwen3_5_dir, budget, max_num_seqs)
    block_bytes, slot_bytes = _spec_bytes(tiny_qwen3_5_dir, llm)
    runner = llm.engine.executor.runner
    assert runner.num_state_slots == max_num_seqs
    assert runner.model.recurrent_layers()[0].ssm_state.shape[0] == max_num_seqs
    assert llm.engine.num_blocks == (budget - max_num_seqs * slot_bytes) // block_bytes


def test_state_slots_bound_the_seats_where_the_budget_is_short(tiny_qwen3_5_dir: str) -> None:
    """256 seats would take 4 MiB of a 1 MiB budget: the pool gets about a quarter of it, its
    slots bound how many requests run at once, and requests beyond them wait."""
    budget = 1 << 20
    llm = _cpu_llm(tiny_qwen3_5_dir, budget, 256)
    block_bytes, slot_bytes = _spec_bytes(tiny_qwen3_5_dir, llm)
    num_slots = llm.engine.executor.runner.num_state_slots
    num_blocks = llm.engine.num_blocks
    assert 1 < num_slots < 256 and num_slots * slot_bytes <= budget // 4
    assert budget - block_bytes < num_blocks * block_bytes + num_slots * slot_bytes <= budget
    assert llm.engine.scheduler.block_manager.num_state_slots == num_slots
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    requests = [{"prompt_token_ids": [i + 1, i + 2]} for i in range(num_slots + 3)]
    outputs = llm.generate(requests, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 2 for o in outputs)


def test_cpu_budget_counts_the_snapshots(tiny_qwen3_5_dir: str) -> None:
    """With prefix caching the pool also holds snapshots, up to an eighth of the KV's bytes,
    after the running slots; blocks, slots and snapshots fit the budget together."""
    budget, max_num_seqs = 1 << 20, 8
    llm = _cpu_llm(tiny_qwen3_5_dir, budget, max_num_seqs, prefix_caching=True)
    block_bytes, slot_bytes = _spec_bytes(tiny_qwen3_5_dir, llm)
    runner, num_blocks = llm.engine.executor.runner, llm.engine.num_blocks
    snapshots = llm.engine.scheduler.block_manager.snapshots
    assert runner.num_state_slots == max_num_seqs
    assert snapshots.num_slots == num_blocks * block_bytes // (SNAPSHOT_SHARE * slot_bytes) > 0
    num_pool_slots = runner.model.recurrent_layers()[0].ssm_state.shape[0]
    assert num_pool_slots == max_num_seqs + snapshots.num_slots
    assert budget - block_bytes < num_blocks * block_bytes + num_pool_slots * slot_bytes <= budget
    # Deterministic mode keeps none: a hit would move the rule's chunk boundaries.
    setup = llm.engine.setup
    config = dataclasses.replace(setup.config, deterministic=True, attention_backend="triton")
    deterministic = dataclasses.replace(setup, config=config)
    assert state_budget_for(deterministic, num_blocks).num_snapshot_slots == 0


def test_cpu_budget_counts_the_draft_state_slots(tiny_qwen3_5_dir: str) -> None:
    """With speculative decoding (k = 3) the pool also holds the states after each draft of a
    verify step: k for each of the 8 seats (at most disable_by_batch_size = 4 of which draft
    at once: 12), after the running slots; all fit the budget with the blocks."""
    budget = 1 << 20
    spec = {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4}
    llm = LLM(
        tiny_qwen3_5_dir, dtype="float32", device="cpu", block_size=BLOCK_SIZE,
        kv_cache_memory=budget, max_num_seqs=8, enable_prefix_caching=False,
        speculative_config=spec,
    )  # fmt: skip
    block_bytes, slot_bytes = _spec_bytes(tiny_qwen3_5_dir, llm)
    num_pool_slots = llm.engine.executor.runner.model.recurrent_layers()[0].ssm_state.shape[0]
    assert num_pool_slots == 8 + 12
    coordinator = llm.engine.scheduler.block_manager
    assert coordinator.takes_drafts and coordinator.num_free_draft_state_slots == 12
    num_blocks = llm.engine.num_blocks
    assert budget - block_bytes < num_blocks * block_bytes + num_pool_slots * slot_bytes <= budget
