"""Structured outputs under tensor parallelism on the CPU (gloo): rank 0 fills each constrained
step's mask and the workers apply the same one, so TP=2 gives TP=1's tokens, greedy and
seeded, alone and batched with unconstrained requests, under async and sync scheduling; a
fill that fails on rank 0 fails that step on every rank and the engine goes on."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from minivllm import LLM, SamplingParams
from minivllm.structured_output import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["ok", "n"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
REGEX = r"(yes|no)-[0-9]{3}"
PROMPTS = ["hello there", "the quick brown fox", "a b c d e f g"]


def constrained(temperature: float, seed: int | None = None, **spec) -> SamplingParams:
    return SamplingParams(
        temperature=temperature,
        seed=seed,
        max_tokens=40,
        structured_outputs=StructuredOutputsParams(**spec),
    )


JSON_GREEDY = constrained(0.0, json=SCHEMA)
JSON_SEEDED = constrained(1.0, seed=3, json=SCHEMA)
REGEX_GREEDY = constrained(0.0, regex=REGEX)
REGEX_SEEDED = constrained(1.0, seed=4, regex=REGEX)
PLAIN_GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PLAIN_SEEDED = SamplingParams(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)


def make_llm(model_dir: str, tp: int, **options) -> LLM:
    return LLM(
        model_dir, dtype="float32", device="cpu", block_size=4, tensor_parallel_size=tp, **options
    )


@pytest.fixture(scope="module")
def tp1(tiny_qwen3_dir: str):
    llm = make_llm(tiny_qwen3_dir, 1)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module", params=[True, False], ids=["async", "sync"])
def tp2(tiny_qwen3_dir: str, request: pytest.FixtureRequest):
    """Under async scheduling, then sync (one TP engine at a time in a process)."""
    llm = make_llm(tiny_qwen3_dir, 2, async_scheduling=request.param)
    yield llm
    llm.shutdown()


def outputs(llm: LLM, prompts: list[str], params: list[SamplingParams]):
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def check_valid(out, params: SamplingParams) -> None:
    spec = params.structured_outputs
    if spec is None:
        return
    assert out.finish_reason == "stop", out.text
    if spec.json is not None:
        schema = {k: v for k, v in SCHEMA.items() if k != "x-guidance"}
        jsonschema.validate(json.loads(out.text), schema)
    else:
        assert re.fullmatch(REGEX, out.text), out.text


def assert_same_valid(split, base, params: list[SamplingParams]) -> None:
    assert [o.token_ids for o in split] == [o.token_ids for o in base]
    for out, p in zip(split, params):
        check_valid(out, p)


def test_batched_with_unconstrained_equals_tp1(tp1: LLM, tp2: LLM) -> None:
    params = [JSON_GREEDY, JSON_SEEDED, REGEX_GREEDY, REGEX_SEEDED, PLAIN_GREEDY, PLAIN_SEEDED]
    prompts = (PROMPTS * 2)[: len(params)]
    assert_same_valid(outputs(tp2, prompts, params), outputs(tp1, prompts, params), params)


@pytest.mark.parametrize("params", [JSON_GREEDY, JSON_SEEDED, REGEX_GREEDY, REGEX_SEEDED])
def test_alone_equals_tp1(tp1: LLM, tp2: LLM, params: SamplingParams) -> None:
    prompts = PROMPTS[1:2]
    assert_same_valid(outputs(tp2, prompts, [params]), outputs(tp1, prompts, [params]), [params])


def test_failed_fill_on_rank0_fails_the_step_and_engine_goes_on(
    tp1: LLM, tp2: LLM, monkeypatch
) -> None:
    manager = tp2.engine.structured_outputs
    fill = manager.fill
    calls = [0]

    def fail_third(requests, rows, drafts=None):
        calls[0] += 1
        if calls[0] == 3:
            raise ValueError("injected fill failure")
        return fill(requests, rows, drafts)

    monkeypatch.setattr(manager, "fill", fail_third)
    params = [JSON_SEEDED, PLAIN_GREEDY]
    with pytest.raises(ValueError, match="injected fill failure"):
        outputs(tp2, PROMPTS[:2], params)
    assert calls[0] == 3
    assert_same_valid(outputs(tp2, PROMPTS[:2], params), outputs(tp1, PROMPTS[:2], params), params)
