"""A constrained request's spec compiles once, in the engine that runs it: a frontend asks
the engine core to check it (over the core process's socket), and the request's own compile
there is a cache hit."""

from __future__ import annotations

import os

import pytest

from minivllm.config import EngineConfig
from minivllm.engine.client.core_client import EngineCoreClient, EngineCoreError
from minivllm.engine.client.core_process import CORE_FACTORY_ENV
from minivllm.engine.client.protocol import MessageKind
from minivllm.models.model_config import ModelConfig
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.compiler import CompilerBusy
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.structured_output.params import StructuredOutputsParams

HERE = os.path.dirname(os.path.abspath(__file__))
GOOD = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}})
BAD = StructuredOutputsParams(json={"type": "nope"})


def test_a_check_compiles_where_the_request_then_finds_it(tiny_qwen3_dir: str) -> None:
    manager = StructuredOutputManager(tiny_qwen3_dir, 1024, max_num_seqs=4)
    assert manager.check(GOOD.spec_key()).result(30) == CheckOutcome()
    compiler = manager._compiler.result()
    misses = compiler.cache_info().misses
    request = manager.new_request(GOOD)
    assert request.compile.done() and compiler.cache_info().misses == misses  # a hit
    bad = manager.check(BAD.spec_key()).result(30)
    assert bad.error == "invalid" and "Invalid type: nope" in bad.message
    with pytest.raises(ValueError, match="Invalid type: nope"):
        bad.raise_error()


def test_outcomes_raise_what_the_frontend_maps_to_an_http_status() -> None:
    with pytest.raises(CompilerBusy, match="its 3 workers are compiling"):
        CheckOutcome.of_error(CompilerBusy(3)).raise_error()
    with pytest.raises(RuntimeError, match="OSError: no tokenizer"):
        CheckOutcome.of_error(OSError("no tokenizer")).raise_error()
    CheckOutcome().raise_error()  # compiled: nothing to raise


def test_the_core_process_answers_checks_over_its_socket(tiny_qwen3_dir: str) -> None:
    env = dict(os.environ)
    env[CORE_FACTORY_ENV] = "grammar_check_core:CheckingCore"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    messages: list[tuple] = []
    config = EngineConfig(tiny_qwen3_dir, device="cpu")
    client = EngineCoreClient(config, ModelConfig.from_hf(tiny_qwen3_dir), messages.append, env)
    try:
        good = client.check_grammar(GOOD.spec_key(), refuse_when_busy=True)
        bad = client.check_grammar(BAD.spec_key())
        assert good.result(60) == CheckOutcome()
        assert bad.result(60).error == "invalid" and "nope" in bad.result().message
        # Answers settle their futures; on_message sees none of them.
        assert all(msg[0] is MessageKind.OUTPUTS for msg in messages)
    finally:
        client.shutdown()
    with pytest.raises(EngineCoreError, match="the engine core is gone"):
        client.check_grammar(GOOD.spec_key()).result(5)
