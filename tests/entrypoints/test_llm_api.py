"""LLM's vLLM surface that a newcomer reaches for: the default model, get_tokenizer(), and
cumulative_logprob (the sum of the sampled tokens' logprobs, when logprobs are asked for)."""

from __future__ import annotations

import math

import pytest

from minivllm import LLM, SamplingParams
from minivllm.entrypoints import llm as llm_module

CPU = {"device": "cpu", "dtype": "float32", "block_size": 4, "num_gpu_blocks_override": 256}


@pytest.fixture(scope="module")
def tiny_llm(tiny_qwen3_dir: str):
    engine = LLM(tiny_qwen3_dir, **CPU)
    yield engine
    engine.shutdown()


def test_llm_without_a_model_uses_the_demo_model(tiny_qwen3_dir, monkeypatch) -> None:
    # The tiny model stands in for the demo model (which may not be installed here).
    monkeypatch.setattr(llm_module, "default_model", lambda: (tiny_qwen3_dir, "[minivllm] demo"))
    engine = LLM(**CPU)
    try:
        assert engine.config.model == tiny_qwen3_dir
    finally:
        engine.shutdown()


def test_get_tokenizer(tiny_llm: LLM) -> None:
    tokenizer = tiny_llm.get_tokenizer()
    assert tokenizer is tiny_llm.tokenizer
    assert tokenizer.decode(tokenizer.encode("hello world")).strip().endswith("world")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cumulative_logprob_is_the_sum_of_the_sampled_logprobs(tiny_llm, temperature):
    params = SamplingParams(temperature=temperature, max_tokens=12, logprobs=2, n=2, seed=3)
    (out,) = tiny_llm.generate(["Hello"], params, use_tqdm=False)
    for completion in out.outputs:
        expected = sum(lp[t].logprob for t, lp in zip(completion.token_ids, completion.logprobs))
        assert completion.cumulative_logprob is not None
        assert math.isclose(completion.cumulative_logprob, expected, rel_tol=1e-9, abs_tol=1e-9)
        assert completion.cumulative_logprob < 0
    (plain,) = tiny_llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)
    assert plain.outputs[0].cumulative_logprob is None  # as in vLLM: only with logprobs


def test_priority_policy_serves_lower_values_first(tiny_qwen3_dir: str) -> None:
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4, max_num_seqs=1,
              scheduling_policy="priority")  # fmt: skip
    try:
        prompts = [{"prompt_token_ids": [5 + i] * 6} for i in range(4)]
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        outputs = llm.generate(prompts, params, use_tqdm=False, priority=[3, -1, 7, 0])
        started = [o.metrics.first_scheduled_time for o in outputs]
        order = sorted(range(4), key=lambda i: started[i])
        assert order == [1, 3, 0, 2]  # one at a time, by priority
        with pytest.raises(ValueError, match="priorities for"):
            llm.generate(prompts, params, use_tqdm=False, priority=[0])
    finally:
        llm.shutdown()


def test_a_priority_needs_the_priority_policy(tiny_llm: LLM) -> None:
    with pytest.raises(ValueError, match="priority scheduling policy"):
        tiny_llm.generate("Hi", SamplingParams(max_tokens=1), use_tqdm=False, priority=[1])
    out = tiny_llm.generate("Hi", SamplingParams(max_tokens=1), use_tqdm=False, priority=[0])
    assert len(out[0].outputs[0].token_ids) == 1
