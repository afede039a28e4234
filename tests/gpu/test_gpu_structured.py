"""GPU: structured outputs through the engine on CUDA (Triton sampler, CUDA graphs for the
decode steps, pinned bitmask buffers, async scheduling): constrained outputs follow their
grammar, unconstrained neighbours keep the tokens they get alone, and deterministic mode gives
a constrained request the same tokens alone and batched."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.structured_output import StructuredOutputsParams
from tests.structured_output.test_engine_integration import CHOICES, REGEX, SCHEMA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _constrained(**kind) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=48, structured_outputs=StructuredOutputsParams(**kind)
    )


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_constrained_beside_unconstrained_on_cuda(tiny_qwen3_dir: str, deterministic) -> None:
    llm = LLM(tiny_qwen3_dir, dtype="bfloat16", deterministic=deterministic)
    free = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone_free = llm.generate(["the quick brown fox"], free, use_tqdm=False)[0].outputs[0]
    alone_json = llm.generate(["hello"], _constrained(json=SCHEMA), use_tqdm=False)[0].outputs[0]
    params = [
        _constrained(json=SCHEMA),
        _constrained(regex=REGEX),
        _constrained(choice=CHOICES),
        free,
        SamplingParams(
            temperature=1.0,
            seed=3,
            max_tokens=48,
            structured_outputs=(StructuredOutputsParams(json=SCHEMA)),
        ),
    ]
    prompts = ["hello", "a b c", "d e f", "the quick brown fox", "seeded"]
    outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    jsonschema.validate(json.loads(outs[0].text), SCHEMA)
    assert re.fullmatch(REGEX, outs[1].text) and outs[1].finish_reason == "stop"
    assert outs[2].text in CHOICES and outs[2].finish_reason == "stop"
    assert outs[3].token_ids == alone_free.token_ids
    jsonschema.validate(json.loads(outs[4].text), SCHEMA)
    if deterministic:  # a constrained request's tokens do not depend on its neighbours
        assert outs[0].token_ids == alone_json.token_ids
    llm.shutdown()


def test_first_constrained_step_compiles_no_mask_kernel(tiny_qwen3_dir: str) -> None:
    """The runner compiles the mask kernel at start, for its logits' specialization (dtype,
    width, row stride): a first constrained request adds no variant of it, so it waits for
    no compile. Counted in Triton's cache, so that kernels compiled by earlier tests in the
    process do not hide a variant the start-up missed."""
    from minivllm.kernels.bitmask import _mask_logits_kernel

    def variants() -> int:
        return sum(len(cache[0]) for cache in _mask_logits_kernel.device_caches.values())

    llm = LLM(tiny_qwen3_dir, dtype="bfloat16")
    compiled = variants()
    assert compiled >= 1
    out = llm.generate(["hello"], _constrained(json=SCHEMA), use_tqdm=False)[0].outputs[0]
    jsonschema.validate(json.loads(out.text), SCHEMA)
    assert variants() == compiled
    llm.shutdown()


def test_penalized_beside_forced_drafts_on_cuda(tiny_qwen3_dir: str) -> None:
    """Deterministic mode, async scheduling: a penalized request keeps the tokens it gets
    alone beside a JSON request whose grammar forces drafts (the drafted step counts the
    penalized row's token on the device before the next step, launched before it is read,
    samples it)."""
    llm = LLM(tiny_qwen3_dir, dtype="bfloat16", deterministic=True)
    penalized = SamplingParams(
        temperature=0.0, max_tokens=32, ignore_eos=True, repetition_penalty=1.5,
        frequency_penalty=0.5,
    )  # fmt: skip
    alone = llm.generate(["the quick brown fox"], penalized, use_tqdm=False)[0].outputs[0]
    outs = llm.generate(
        ["hello", "the quick brown fox"], [_constrained(json=SCHEMA), penalized], use_tqdm=False
    )
    llm.shutdown()
    jsonschema.validate(json.loads(outs[0].outputs[0].text), SCHEMA)
    assert outs[1].outputs[0].token_ids == alone.token_ids
