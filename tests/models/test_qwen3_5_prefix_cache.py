"""Prefix-cache hits on the tiny Qwen3.5 (hybrid): a request that shares a cached prefix with a
recurrent-state snapshot at its end resumes there (num_cached_tokens > 0), and its greedy
tokens and logprobs are still HF's float32 ones (1e-4) and the engine's without prefix
caching: the next turns of a chat (hitting after the turn before's answer, with and without
async scheduling), prefixes diverging mid-block, a shared prefix first seen without a
snapshot, alone and by a batch in one step, eviction under a small cache, preemption and
chunked prefill across the snapshot's boundary. Skipping the restore, and an answer's
snapshot saved at the wrong position, are caught."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from minivllm.engine.runner import model_runner
from minivllm.engine.sched.kv.rolling_snapshots import RollingSnapshots
from tests.models.hf_greedy import assert_greedy_matches_hf, cpu_llm

BASE = list(range(20, 90))  # 70 tokens (past a 64-token chunk of the rule): snapshot at 68
MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def hf_model(tiny_qwen3_5_dir: str):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_5_dir, dtype=torch.float32).eval()


def generate(llm: LLM, prompts: list[list[int]]) -> list:
    """The prompts in one batch: their RequestOutputs."""
    return llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)


def one_by_one(llm: LLM, prompts: list[list[int]]) -> list:
    """Each prompt after the one before has finished (each step saves its snapshots)."""
    return [generate(llm, [p])[0] for p in prompts]


def assert_matches_hf(hf_model, prompts: list[list[int]], outputs: list) -> None:
    completions = [o.outputs[0] for o in outputs]
    assert_greedy_matches_hf(hf_model, prompts, completions, MAX_TOKENS)


def assert_matches_no_caching(model_dir: str, prompts: list[list[int]], outputs: list) -> None:
    plain = generate(cpu_llm(model_dir, enable_prefix_caching=False), prompts)
    for ours, theirs in zip(outputs, plain, strict=True):
        assert ours.outputs[0].token_ids == theirs.outputs[0].token_ids
        for mine, other in zip(ours.outputs[0].logprobs, theirs.outputs[0].logprobs, strict=True):
            for token, logprob in mine.items():
                assert logprob.logprob == pytest.approx(other[token].logprob, abs=1e-4)


def chat_turns(llm: LLM, num_turns: int = 2) -> tuple[list[list[int]], list]:
    """BASE, then each turn the one before's prompt, its answer and five more tokens (the
    agent's case). A turn computes its prompt and 7 of its 8 answer tokens (the last is only
    sampled): the next one hits at the last block boundary of those, 76 after BASE."""
    prompts, outputs = [BASE], [generate(llm, [BASE])[0]]
    for turn in range(1, num_turns):
        answer = list(outputs[-1].outputs[0].token_ids)
        prompts.append(prompts[-1] + answer + [7 + turn, 8, 9, 10, 11])
        outputs.append(generate(llm, prompts[-1:])[0])
    return prompts, outputs


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_next_turns_hit_after_the_answer_and_match_hf(
    tiny_qwen3_5_dir: str, hf_model, async_scheduling: bool
) -> None:
    """Turn 2 (83 tokens) hits at 76, past BASE's 70, in the first answer's snapshot; turn 3
    (96) at 88, in the second's."""
    llm = cpu_llm(tiny_qwen3_5_dir, async_scheduling=async_scheduling)
    prompts, outputs = chat_turns(llm, num_turns=3)
    assert [o.num_cached_tokens for o in outputs] == [0, 76, 88]
    assert_matches_hf(hf_model, prompts, outputs)
    assert_matches_no_caching(tiny_qwen3_5_dir, prompts[1:], outputs[1:])


def test_answer_snapshot_of_the_wrong_position_is_caught(
    tiny_qwen3_5_dir: str, hf_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode's state after 76 tokens kept as the one after 72: the next turn resumes at 72
    from the state of 76, not HF's tokens."""
    save = RollingSnapshots.save
    monkeypatch.setattr(
        RollingSnapshots, "save",
        lambda self, request, end, copies: save(self, request, end - 4, copies),
    )  # fmt: skip
    prompts, outputs = chat_turns(cpu_llm(tiny_qwen3_5_dir))
    assert outputs[1].num_cached_tokens == 72
    with pytest.raises(AssertionError):
        assert_matches_hf(hf_model, prompts[1:], outputs[1:])


def test_skipped_restore_is_caught(
    tiny_qwen3_5_dir: str, hf_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the restore the hit resumes from whatever its slot held: not HF's tokens."""
    monkeypatch.setattr(model_runner, "restore_snapshots", lambda pool, sched_out: None)
    prompts, outputs = chat_turns(cpu_llm(tiny_qwen3_5_dir))
    assert outputs[1].num_cached_tokens == 76
    with pytest.raises(AssertionError):
        assert_matches_hf(hf_model, prompts[1:], outputs[1:])


def test_partial_hits(tiny_qwen3_5_dir: str, hf_model) -> None:
    """After BASE: a prompt diverging inside block 17 hits BASE's snapshot at 68; one
    diverging inside block 16 finds its blocks cached but no snapshot at 64, so it computes
    from 0 and saves one there, which the next such prompt hits."""
    llm = cpu_llm(tiny_qwen3_5_dir)
    prompts = [BASE, BASE[:69] + [300, 301, 302], BASE[:66] + [310] * 6, BASE[:65] + [320] * 3]
    outputs = one_by_one(llm, prompts)
    assert [o.num_cached_tokens for o in outputs] == [0, 68, 0, 64]
    assert_matches_hf(hf_model, prompts, outputs)
    assert_matches_no_caching(tiny_qwen3_5_dir, prompts, outputs)


def test_a_prefix_shared_in_one_batch_is_computed_twice_not_each_time(
    tiny_qwen3_5_dir: str, hf_model
) -> None:
    """Four prompts of BASE and tails of their own, in one step's budget: the first computes
    BASE's blocks, the second computes them again to save a snapshot at their end (68); the
    others wait a step for it and hit there instead of computing BASE too."""
    llm = cpu_llm(tiny_qwen3_5_dir)
    prompts = [BASE + [100 * i + j for j in range(20)] for i in range(1, 5)]
    outputs = generate(llm, prompts)
    assert [o.num_cached_tokens for o in outputs] == [0, 0, 68, 68]
    assert_matches_hf(hf_model, prompts, outputs)


def test_eviction_under_a_small_cache(tiny_qwen3_5_dir: str, hf_model) -> None:
    """Two snapshot slots and 64 blocks: a third prompt's snapshot evicts the least recently
    used one (A's); a long prompt then takes C's blocks, and C's snapshot dies with them."""
    llm = cpu_llm(tiny_qwen3_5_dir, num_gpu_blocks_override=64, max_num_seqs=2)
    assert llm.engine.scheduler.block_manager.snapshots.num_slots == 2
    a, b, c = ([base + i for i in range(40)] for base in (100, 200, 300))
    long_prompt = [400 - i % 90 for i in range(240)]
    prompts = [a, b, c, a + [1], c + [2], long_prompt, c + [3]]
    outputs = one_by_one(llm, prompts)
    assert [o.num_cached_tokens for o in outputs] == [0, 0, 0, 0, 40, 0, 0]
    assert_matches_hf(hf_model, prompts, outputs)


def test_preemption_with_hits(tiny_qwen3_5_dir: str, hf_model) -> None:
    """Four prompts after BASE, each BASE and 40 tokens of its own, in 60 blocks: all hit at
    68, some are preempted and recomputed (hitting again), all match HF."""
    llm = cpu_llm(tiny_qwen3_5_dir, num_gpu_blocks_override=60)
    generate(llm, [BASE])
    prompts = [BASE + [100 * i + j for j in range(40)] for i in range(1, 5)]
    outputs = generate(llm, prompts)
    assert llm.engine.stats().num_preemptions > 0
    assert [o.num_cached_tokens for o in outputs] == [68] * 4
    assert_matches_hf(hf_model, prompts, outputs)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_chunked_prefill_across_the_snapshot(
    tiny_qwen3_5_dir: str, hf_model, async_scheduling: bool
) -> None:
    """Chunks of 24 tokens: BASE's prefill stops at 68 to save its state (24, 24, 20, 2), and
    the next turn resumes after the answer, at 76, then stops at 80 (its prompt's last block
    boundary); with and without async scheduling."""
    llm = cpu_llm(tiny_qwen3_5_dir, max_num_batched_tokens=24, async_scheduling=async_scheduling)
    prompts, outputs = chat_turns(llm)
    assert [o.num_cached_tokens for o in outputs] == [0, 76]
    assert_matches_hf(hf_model, prompts, outputs)
