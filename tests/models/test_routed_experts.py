"""enable_return_routed_experts on the tiny Qwen3-MoE checkpoint (sparse layers 0 and 2, top-2
of 8): every forwarded token's experts in every sparse layer are HF's router top-k for that
token in the whole sequence (prompt + output), batched and alone, with chunked prefill, a
prefix-cache hit, preemption and n-gram drafts, and on the hybrid Qwen3.5-MoE; refused by a
dense model (off by default: tests/models/test_qwen3_moe_llm.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, EngineConfig, SamplingParams
from minivllm.engine.setup import resolve_setup
from minivllm.models.model_config import ModelConfig
from tests.models.hf_greedy import cpu_llm
from tests.models.hf_routing import assert_routing_matches_hf

PROMPTS = [
    [5, 17, 42, 99, 3],
    [7] * 13 + [8, 9],
    [100, 200, 300],
    list(range(20, 57)),
    [11],
]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_moe_dir: str):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_moe_dir, dtype=torch.float32).eval()


def routed_llm(model_dir: str, **options) -> LLM:
    return cpu_llm(model_dir, enable_return_routed_experts=True, **options)


def generate(llm: LLM, prompts: list[list[int]], **params) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, **params)
    requests = [{"prompt_token_ids": p} for p in prompts]
    return [o.outputs[0] for o in llm.generate(requests, params, use_tqdm=False)]


def test_batched_and_alone_match_hf(tiny_qwen3_moe_dir: str, hf_model) -> None:
    llm = routed_llm(tiny_qwen3_moe_dir)
    batched = generate(llm, PROMPTS)
    assert_routing_matches_hf(hf_model, PROMPTS, batched)
    alone = [generate(llm, [p])[0] for p in PROMPTS[:2]]
    assert_routing_matches_hf(hf_model, PROMPTS[:2], alone)


def test_chunked_prefill_matches_hf(tiny_qwen3_moe_dir: str, hf_model) -> None:
    llm = routed_llm(tiny_qwen3_moe_dir, max_num_batched_tokens=8, enable_prefix_caching=False)
    assert_routing_matches_hf(hf_model, PROMPTS, generate(llm, PROMPTS))


def test_prefix_cache_hit_keeps_the_cached_tokens_routing(
    tiny_qwen3_moe_dir: str, hf_model
) -> None:
    """The second prompt starts with the first's 37 tokens: its first 36 are served from the
    cache (9 blocks of 4), their routing read where their KV is."""
    llm = routed_llm(tiny_qwen3_moe_dir)
    first = PROMPTS[3]
    second = first + [400, 401, 402]
    assert_routing_matches_hf(hf_model, [first], generate(llm, [first]))
    [out] = llm.generate([{"prompt_token_ids": second}], _greedy(), use_tqdm=False)
    assert out.num_cached_tokens == 36
    assert_routing_matches_hf(hf_model, [second], [out.outputs[0]])


def test_preemption_matches_hf(tiny_qwen3_moe_dir: str, hf_model) -> None:
    """20 blocks of 4 do not hold every request's outputs: some are preempted and recomputed
    (their blocks reused by others meanwhile)."""
    llm = routed_llm(tiny_qwen3_moe_dir, num_gpu_blocks_override=20)
    completions = generate(llm, PROMPTS)
    assert llm.engine.stats().num_preemptions > 0
    assert_routing_matches_hf(hf_model, PROMPTS, completions)


def test_drafted_steps_match_hf(tiny_qwen3_moe_dir: str, hf_model) -> None:
    """n-gram drafts: a verify step forwards drafts, and only the accepted ones' rows count.
    Synchronous steps: these prompts' drafts are then rejected part-way (drafted from a step
    later under async scheduling, all of them are accepted)."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    llm = routed_llm(tiny_qwen3_moe_dir, speculative_config=spec, async_scheduling=False)
    prompts = [[7, 8, 9] * 6, PROMPTS[0], PROMPTS[2]]  # outputs that repeat tokens
    completions = generate(llm, prompts)
    stats = llm.engine.stats()
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert_routing_matches_hf(hf_model, prompts, completions)


def test_hybrid_moe_matches_hf(tiny_qwen3_5_moe_dir: str) -> None:
    """Qwen3.5-MoE (Gated DeltaNet layers, every MLP sparse, a shared expert), batched, then a
    prompt that hits the prefix cache (a recurrent-state snapshot and attention blocks)."""
    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3_5_moe_dir, dtype=torch.float32).eval()
    llm = routed_llm(tiny_qwen3_5_moe_dir)
    assert_routing_matches_hf(hf, PROMPTS[:4], generate(llm, PROMPTS[:4]))
    longer = PROMPTS[3] + [400, 401]
    [out] = llm.generate([{"prompt_token_ids": longer}], _greedy(), use_tqdm=False)
    assert out.num_cached_tokens > 0
    assert_routing_matches_hf(hf, [longer], [out.outputs[0]])


def test_dense_model_refuses_the_option(tiny_qwen3_dir: str) -> None:
    config = EngineConfig(tiny_qwen3_dir, device="cpu", enable_return_routed_experts=True)
    with pytest.raises(ValueError, match="enable_return_routed_experts: Qwen3ForCausalLM"):
        resolve_setup(config, ModelConfig.from_hf(tiny_qwen3_dir))


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
