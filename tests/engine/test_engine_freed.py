"""An LLM leaves nothing behind: after shutdown, `del` and gc.collect() its runner (model weights,
KV cache) is gone, so a second engine in the same process profiles the whole memory budget."""

from __future__ import annotations

import gc
import weakref

import pytest

from minivllm import LLM, SamplingParams
from minivllm.structured_output import StructuredOutputsParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=1)


def _runner_ref(model_dir: str, **options) -> tuple[list[weakref.ref], list]:
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=8, **options)
    outs = llm.generate([{"prompt_token_ids": [3, 4, 5, 6, 7]}], PARAMS, use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 2
    runner = llm.engine.executor.runner
    refs = [weakref.ref(runner), weakref.ref(runner.model)]  # the weights may leak alone
    del runner
    llm.shutdown()
    del llm
    return refs, outs


@pytest.mark.parametrize(
    "options",
    [{}, {"attention_backend": "triton", "deterministic": True}],
    ids=["default", "deterministic"],
)
def test_runner_freed_after_shutdown(tiny_qwen3_dir: str, options: dict) -> None:
    # The request outputs are still alive here: they must not reach back into the engine.
    refs, outs = _runner_ref(tiny_qwen3_dir, **options)
    gc.collect()
    for ref in refs:
        assert ref() is None, [type(r) for r in gc.get_referrers(ref())]
    assert outs[0].outputs[0].logprobs  # (keeps `outs` alive through the collection)


def test_gc_heap_frozen_while_the_engine_lives_and_a_dropped_engine_still_freed(
    tiny_qwen3_dir: str,
) -> None:
    # EngineCore freezes what exists at its start (the cyclic GC then skips ~200k objects a
    # full collection) and unfreezes at shutdown, which `del` reaches through LLM.__del__.
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=8)
    assert gc.get_freeze_count() > 0
    llm.generate([{"prompt_token_ids": [3, 4, 5]}], PARAMS, use_tqdm=False)
    ref = weakref.ref(llm.engine.executor.runner.model)
    del llm  # no shutdown()
    gc.collect()
    assert gc.get_freeze_count() == 0
    assert ref() is None


def test_runner_freed_after_a_structured_output_spec_failed(tiny_qwen3_dir: str) -> None:
    # A spec that does not compile fails its call with a ValueError, raised from the compile's
    # future, which the process's compile cache keeps (the spec fails again). Raising that
    # exception must not hang the caller's frames (the LLM, its engine) on its traceback.
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=8)
    bad = SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(regex="(("))
    for _ in range(2):  # the compile, then the cached failure
        with pytest.raises(ValueError, match="invalid structured output regex"):
            llm.generate([{"prompt_token_ids": [3, 4, 5]}], bad, use_tqdm=False)
    ref = weakref.ref(llm.engine.executor.runner.model)
    llm.shutdown()
    del llm
    gc.collect()
    assert ref() is None, [type(r) for r in gc.get_referrers(ref())]
