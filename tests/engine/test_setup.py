"""The configuration is resolved once (EngineSetup) and each request is validated once, by
its frontend; every engine behind a frontend has the EngineClient calls."""

from __future__ import annotations

import inspect
import pickle

import pytest

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.engine import setup as engine_setup
from minivllm.engine.client.core_client import EngineCoreClient
from minivllm.engine.client.dp_core_client import DPCoreClient
from minivllm.engine.client.dp_engine import DPEngine
from minivllm.engine.client.protocol import EngineClient
from minivllm.engine.engine_core import EngineCore
from minivllm.entrypoints import llm as llm_module
from minivllm.models.model_config import ModelConfig

OPTIONS = dict(dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=64)


def _counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_configuration_resolved_once(tiny_qwen3_dir: str, monkeypatch) -> None:
    reads = _counting(monkeypatch, ModelConfig, "from_hf")
    devices = _counting(monkeypatch, EngineConfig, "resolved_device")
    limits = _counting(monkeypatch, engine_setup, "resolve_scheduler_limits")
    llm = LLM(tiny_qwen3_dir, max_num_seqs=5, **OPTIONS)
    assert (len(reads), len(devices), len(limits)) == (1, 1, 1)
    setup = llm.engine.setup
    assert setup.limits.max_num_seqs == 5 == llm.engine.scheduler.max_num_seqs
    assert llm.engine.executor.runner.limits is setup.limits
    assert llm.engine.info.max_model_len == setup.max_model_len
    # It crosses to TP workers pickled: plain data, equal on the other side.
    assert pickle.loads(pickle.dumps(setup)) == setup


def test_request_validated_once(tiny_qwen3_dir: str, monkeypatch) -> None:
    llm = LLM(tiny_qwen3_dir, **OPTIONS)
    params = SamplingParams(n=2, temperature=0.0, max_tokens=2, seed=-1)
    inits = _counting(monkeypatch, SamplingParams, "__post_init__")
    checks = _counting(monkeypatch, llm_module, "check_request")
    prompts = [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [2, 2]
    assert len(inits) == 0  # the frontend's copies (eos ids, the n samples) are not re-checked
    assert len(checks) == 2  # one per prompt, in the frontend; none in the core
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([{"prompt_token_ids": [10**9]}], params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_derive_keeps_a_seed_of_minus_one() -> None:
    params = SamplingParams(seed=5, stop="x")
    child = params.derive(n=1, seed=-1)
    assert (child.seed, child.stop, params.seed) == (-1, ["x"], 5)
    with pytest.raises(AssertionError):
        params.derive(not_a_field=1)


@pytest.mark.parametrize("cls", [EngineCore, DPEngine, EngineCoreClient, DPCoreClient])
def test_engines_implement_engine_client(cls: type) -> None:
    for name in ("add_requests", "abort_requests", "check_grammar", "shutdown"):
        want = list(inspect.signature(getattr(EngineClient, name)).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters)[: len(want)] == want
