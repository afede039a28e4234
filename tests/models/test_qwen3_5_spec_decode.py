"""Speculative decoding (n-gram) on the hybrid models: the tiny Qwen3.5 and Qwen3.5-MoE made
repetitive (conftest's repeating_* fixtures), so that drafts are accepted, and rejected
part-way, and the Gated DeltaNet layers' states must be the ones after the accepted tokens
only. Greedy tokens are the engine's without speculation and HF's, batched beside requests
that do not draft, under chunked prefill, with and without async scheduling, and after a
prefix-cache hit on a drafted turn's answer. A rejected draft left in the state is caught."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import SamplingParams, model_loader
from minivllm.engine.sched.kv import draft_states
from tests.models.hf_greedy import assert_greedy_matches_hf, cpu_llm

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}  # fmt: skip
MAX_TOKENS = 40
# The first five draft (their answers loop); the last two (a 1-token answer, and a 2-token
# one with max_tokens 2) never do, and run beside them.
PROMPTS = [[5, 6, 7, 8, 9], [30, 31, 32], [100, 7, 200, 9, 77, 12], [3, 4] * 4, list(range(50, 90))]
QUIET = [[11], [12, 13]]


def run(
    model_dir: str, prompts: list[list[int]], max_tokens: int = MAX_TOKENS, **options
) -> tuple[list, object]:
    """Each prompt's CompletionOutput (greedy, max_tokens, logprobs; QUIET's with 1 or 2
    tokens) and the engine's stats."""
    llm = cpu_llm(model_dir, **options)
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)]
    params = params * len(prompts)
    quiet = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 2)]
    requests = [{"prompt_token_ids": p} for p in prompts + QUIET]
    outs = llm.generate(requests, params + quiet, use_tqdm=False)
    stats = llm.engine.stats()
    llm.shutdown()
    return [o.outputs[0] for o in outs[: len(prompts)]], stats


def assert_drafts_accepted_and_rejected(stats) -> None:
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    # Some step accepted a first draft and rejected a later one (j < k accepted, j > 0).
    assert stats.spec_accepted_per_pos[0] > stats.spec_accepted_per_pos[-1]


@pytest.fixture(scope="module", params=["dense", "moe"])
def model_dir(request, repeating_qwen3_5_dir: str, repeating_qwen3_5_moe_dir: str) -> str:
    return repeating_qwen3_5_dir if request.param == "dense" else repeating_qwen3_5_moe_dir


@pytest.fixture(scope="module")
def plain(model_dir: str) -> list:
    return run(model_dir, PROMPTS)[0]


def test_ngram_matches_plain_decoding_and_hf(model_dir: str, plain: list) -> None:
    ours, stats = run(model_dir, PROMPTS, speculative_config=SPEC)
    assert_drafts_accepted_and_rejected(stats)
    assert [c.token_ids for c in ours] == [c.token_ids for c in plain]
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert_greedy_matches_hf(hf_model, PROMPTS, ours, MAX_TOKENS)


def test_chunked_prefill_synchronous_no_prefix_caching(repeating_qwen3_5_dir: str) -> None:
    """Prompts in chunks of up to 16 tokens beside drafting decodes, synchronous scheduling,
    no snapshots (the copies of the accepted states go to the runner all the same)."""
    plain = run(repeating_qwen3_5_dir, PROMPTS)[0]
    ours, stats = run(repeating_qwen3_5_dir, PROMPTS, speculative_config=SPEC,
                      max_num_batched_tokens=16, enable_prefix_caching=False,
                      async_scheduling=False)  # fmt: skip
    assert_drafts_accepted_and_rejected(stats)
    assert [c.token_ids for c in ours] == [c.token_ids for c in plain]
    # Without the copy of the state after the accepted drafts, the tokens change.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(draft_states.DraftStates, "accept", _accept_without_copy)
        broken, _ = run(repeating_qwen3_5_dir, PROMPTS, speculative_config=SPEC,
                        async_scheduling=False)  # fmt: skip
    assert [c.token_ids for c in broken] != [c.token_ids for c in plain]


def _accept_without_copy(self, request, num_tokens, copies) -> None:
    self.release(request)


def test_next_turn_hits_after_a_drafted_answer(repeating_qwen3_5_dir: str) -> None:
    """Turn 2 (turn 1's prompt, its drafted answer and three tokens) hits at the answer's
    last block boundary, in a rolling snapshot saved while drafting; its tokens are those of
    an engine without prefix caching or speculation."""
    first = [3, 4] * 4
    llm = cpu_llm(repeating_qwen3_5_dir, speculative_config=SPEC)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    turn1 = llm.generate([{"prompt_token_ids": first}], params, use_tqdm=False)[0]
    assert llm.engine.stats().spec_num_accepted_tokens > 0
    second = first + list(turn1.outputs[0].token_ids) + [7, 8, 9]
    turn2 = llm.generate([{"prompt_token_ids": second}], params, use_tqdm=False)[0]
    llm.shutdown()
    # Turn 1 computed its 8 prompt tokens and 39 of its 40 answer tokens: 44 hit.
    assert turn2.num_cached_tokens == 44
    plain = cpu_llm(repeating_qwen3_5_dir, enable_prefix_caching=False)
    expected = plain.generate([{"prompt_token_ids": second}], params, use_tqdm=False)[0]
    assert turn2.outputs[0].token_ids == expected.outputs[0].token_ids


def test_draft_model_method(repeating_qwen3_5_dir: str, tiny_qwen3_dir: str) -> None:
    """A draft model of attention layers only (the tiny Qwen3, same vocabulary) drafting for
    the hybrid target: the target's tokens; a hybrid draft model is refused."""
    plain = run(repeating_qwen3_5_dir, PROMPTS[:2])[0]
    spec = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 2}
    ours, stats = run(repeating_qwen3_5_dir, PROMPTS[:2], speculative_config=spec)
    assert stats.spec_num_draft_tokens > 0
    assert [c.token_ids for c in ours] == [c.token_ids for c in plain]
    hybrid = {**spec, "model": repeating_qwen3_5_dir}
    with pytest.raises(ValueError, match="speculative_config.model"):
        cpu_llm(tiny_qwen3_dir, speculative_config=hybrid)


def test_triton_kernels_in_the_interpreter(
    repeating_qwen3_5_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's path: the Triton conv update and rule step reading and writing other slots
    (and the Triton attention backend), on a loop of the model's own text that drafts at once
    and has a draft rejected part-way: the tokens without speculation."""
    prompt = [[95, 257, 69, 232, 424, 202] * 2]
    plain = run(repeating_qwen3_5_dir, prompt, 12)[0]
    monkeypatch.setattr(model_loader, "use_triton_kernels", lambda device: True)
    ours, stats = run(repeating_qwen3_5_dir, prompt, 12, speculative_config=SPEC,
                      attention_backend="triton")  # fmt: skip
    assert_drafts_accepted_and_rejected(stats)
    assert [c.token_ids for c in ours] == [c.token_ids for c in plain]
