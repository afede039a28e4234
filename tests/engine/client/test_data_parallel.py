"""Data parallelism on the CPU: two engine-core replica processes behind one LLM give the
tokens of one engine on greedy decoding, and the requests are spread over both replicas."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams

PROMPTS = [{"prompt_token_ids": [5 + i, 17, 42, 99 - i, 3]} for i in range(8)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)


def test_dp2_matches_dp1_and_spreads_requests(tiny_qwen3_dir: str) -> None:
    options = dict(dtype="float32", device="cpu", block_size=4)
    single = LLM(tiny_qwen3_dir, **options).generate(PROMPTS, PARAMS, use_tqdm=False)
    llm = LLM(tiny_qwen3_dir, data_parallel_size=2, **options)
    try:
        outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in single]
        assert [len(o.outputs[0].logprobs) for o in outs] == [6] * len(PROMPTS)
        balancer = llm.engine.balancer
        assert balancer.num_assigned == [4, 4]  # equal requests: alternate replicas
        assert balancer.load == [0, 0] and not balancer.replica_of
        again = llm.generate(PROMPTS[:3], PARAMS, use_tqdm=False)  # the engine is reusable
        assert [o.outputs[0].token_ids for o in again] == [
            o.outputs[0].token_ids for o in single[:3]
        ]
    finally:
        llm.shutdown()
    assert not any(r.is_alive for r in llm.engine.client.replicas)


def test_dp_size_must_be_positive(tiny_qwen3_dir: str) -> None:
    with pytest.raises(ValueError, match="data_parallel_size"):
        LLM(tiny_qwen3_dir, device="cpu", data_parallel_size=0)
