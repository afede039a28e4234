"""A constrained request's spec compiles once, in the engine that runs it: a frontend asks
the engine core to check it (over the core process's socket), and the request's own compile
there is a cache hit; the frontend remembers the specs that compiled."""

from __future__ import annotations

import asyncio
import os

import pytest

from minivllm.config import EngineConfig
from minivllm.engine.client.core_client import EngineCoreError
from minivllm.engine.client.core_process import CORE_FACTORY_ENV
from minivllm.entrypoints.async_llm import AsyncLLM, EngineDeadError
from minivllm.structured_output.check import CheckOutcome, CompiledSpecs
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


def test_the_core_process_answers_the_servers_checks(tiny_qwen3_dir: str, monkeypatch) -> None:
    """AsyncLLM (the server's engine) asks its core process over the socket; a spec the core
    compiled passes at once the next time; a bad one is a ValueError naming the problem; once
    the core is gone, a check says the engine is dead."""
    monkeypatch.setenv(CORE_FACTORY_ENV, "grammar_check_core:CheckingCore")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    engine = AsyncLLM(EngineConfig(tiny_qwen3_dir, device="cpu"))
    client = engine._client
    asked: list[tuple] = []
    ask_core = client.check_grammar

    def counted(*args):
        asked.append(args)
        return ask_core(*args)

    monkeypatch.setattr(client, "check_grammar", counted)

    async def checks() -> None:
        await engine.check_grammar(GOOD, refuse_when_busy=True)
        await engine.check_grammar(GOOD, refuse_when_busy=True)  # known: no round trip
        with pytest.raises(ValueError, match="Invalid type: nope"):
            await engine.check_grammar(BAD)
        with pytest.raises(ValueError, match="Invalid type: nope"):
            await engine.check_grammar(BAD)  # a failed spec is asked again (cached there)

    try:
        asyncio.run(checks())
        assert asked == [(GOOD.spec_key(), True), (BAD.spec_key(), False), (BAD.spec_key(), False)]
        client.shutdown()  # the core goes away
        with pytest.raises(EngineCoreError, match="the engine core is gone"):
            client.check_grammar(BAD.spec_key()).result(5)
        with pytest.raises(EngineDeadError, match="the engine core is gone"):
            asyncio.run(engine.check_grammar(BAD))
    finally:
        engine.shutdown()


def test_compiled_specs_keep_the_most_recently_checked() -> None:
    specs = CompiledSpecs(capacity=2)
    a, b, c = (StructuredOutputsParams(regex=r).spec_key() for r in ("a", "b", "c"))
    specs.add(a)
    specs.add(b)
    assert a in specs  # a is now the most recent: b goes first
    specs.add(c)
    assert a in specs and c in specs and b not in specs and len(specs) == 2
    assert StructuredOutputsParams(choice=["a"]).spec_key() not in specs  # kind counts
