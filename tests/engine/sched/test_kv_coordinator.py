"""HybridKVCoordinator: a state slot per request beside its blocks, handed out with the first
blocks, given back on free; no prefix-cache hits; running out of either changes nothing. And
the engine's KV budget on the CPU counts the state pool before it sizes the blocks."""

from __future__ import annotations

from minivllm import LLM
from minivllm.engine.runner.kv_cache import KVCacheSpec
from minivllm.engine.runner.state_cache import RecurrentStateSpec
from minivllm.engine.sched.kv_coordinator import HybridKVCoordinator
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


def test_cpu_budget_counts_the_state_pool(tiny_qwen3_5_dir: str) -> None:
    budget, max_num_seqs = 1 << 20, 8
    llm = LLM(
        tiny_qwen3_5_dir, dtype="float32", device="cpu", block_size=BLOCK_SIZE,
        kv_cache_memory=budget, max_num_seqs=max_num_seqs,
    )  # fmt: skip
    config = ModelConfig.from_hf(tiny_qwen3_5_dir)
    states = RecurrentStateSpec.for_model(config, llm.engine.setup.dtype, "cpu")
    kv = KVCacheSpec.for_model(config, BLOCK_SIZE, llm.engine.setup.dtype, "cpu", 1)
    assert kv.num_layers == 1 and states.num_layers == 3
    state_bytes = max_num_seqs * states.bytes_per_slot
    assert llm.engine.num_blocks == (budget - state_bytes) // kv.bytes_per_block
