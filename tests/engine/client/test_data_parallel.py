"""Data parallelism on the CPU: two engine-core replica processes behind one LLM give the
tokens of one engine on greedy decoding, and the requests are spread over both replicas."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.client import dp_engine
from minivllm.engine.client.protocol import MessageKind
from minivllm.engine.stats import CoreInfo, EngineStats
from minivllm.engine.types import EngineOutput, EngineRequest

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


def test_dp_engine_waits_for_outputs_the_balancer_has_forgotten(monkeypatch) -> None:
    """A replica's reader thread forgets a finished request in the balancer before it queues
    its last output: the engine is unfinished until step() has returned that output (the
    loop of LLM.generate used to end first, and the call raised KeyError)."""

    class ForgetfulClient:
        info = CoreInfo(max_model_len=64, vocab_size=100, num_blocks=8, block_size=4, pid=0)
        balancer = None

        def __init__(self, config, model_config, on_message) -> None:
            self.on_message = on_message

        def add_requests(self, requests: list[EngineRequest]) -> None:
            for r in requests:
                output = EngineOutput(r.req_id, [7], finished=True, finish_reason="length")
                self.on_message((MessageKind.OUTPUTS, [output], EngineStats()))

    monkeypatch.setattr(dp_engine, "DPCoreClient", ForgetfulClient)
    engine = dp_engine.DPEngine(None, None)
    engine.add_requests([EngineRequest("a", [1, 2], SamplingParams(), 0.0)])
    assert engine.has_unfinished_requests()
    assert [(o.req_id, o.new_token_ids) for o in engine.step()] == [("a", [7])]
    assert not engine.has_unfinished_requests() and engine.step() == []
