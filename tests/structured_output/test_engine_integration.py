"""Structured outputs through the engine: LLM.generate on the tiny model under each kind of
constraint, batched with unconstrained requests, under preemption, n > 1, sync and async
scheduling, min_tokens, logprobs, stop strings and deterministic mode."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.types import EngineRequest
from minivllm.structured_output import StructuredOutputsParams
from tests.kernels.ordered_dot import ordered_dot  # noqa: F401 (fixture)

# Tight enough that a random model ends it well within max_tokens.
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
REGEX = r"(yes|no)-[0-9]{3}"
CHOICES = ["alpha", "beta gamma", "delta"]
PROMPTS = ["hello there", "the quick brown fox", "a b c d e f g"]


def so_params(max_tokens: int = 48, **kwargs) -> SamplingParams:
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in SO_KINDS}
    return SamplingParams(
        max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**options), **kwargs
    )


SO_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def generate(llm: LLM, prompts, params):
    return [o.outputs for o in llm.generate(prompts, params, use_tqdm=False)]


def check_json(text: str) -> None:
    jsonschema.validate(json.loads(text), {k: v for k, v in SCHEMA.items() if k != "x-guidance"})


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema(llm: LLM, temperature: float) -> None:
    params = so_params(json=SCHEMA, temperature=temperature, seed=1)
    for (out,) in generate(llm, PROMPTS, params):
        check_json(out.text)
        assert out.finish_reason == "stop"


def test_json_schema_as_string_and_pydantic(llm: LLM) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        # Strict whitespace: a random model would otherwise write spaces until max_tokens.
        model_config = pydantic.ConfigDict(
            extra="forbid", json_schema_extra={"x-guidance": {"whitespace_flexible": False}}
        )
        ok: bool

    for spec in (json.dumps(SCHEMA), Item):
        (out,) = generate(llm, PROMPTS[:1], so_params(json=spec, temperature=0.0))[0]
        assert out.finish_reason == "stop"
        assert isinstance(json.loads(out.text)["ok"], bool)


def test_regex_choice_grammar(llm: LLM) -> None:
    cases = [
        (so_params(regex=REGEX, temperature=1.0, seed=3), lambda t: re.fullmatch(REGEX, t)),
        (so_params(choice=CHOICES, temperature=1.0, seed=4), lambda t: t in CHOICES),
        (
            so_params(grammar='start: "(" NUM ")"\nNUM: /[0-9]{1,3}/', temperature=1.0),
            lambda t: re.fullmatch(r"\([0-9]{1,3}\)", t),
        ),
    ]
    outputs = generate(llm, [PROMPTS[0]] * len(cases), [p for p, _ in cases])
    for (out,), (_, check) in zip(outputs, cases):
        assert check(out.text), out.text
        assert out.finish_reason == "stop"


def test_json_object(llm: LLM) -> None:
    (out,) = generate(llm, PROMPTS[:1], so_params(json_object=True, temperature=0.0))[0]
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:  # a random model may write a long object: what it wrote is a prefix of one
        assert out.finish_reason == "length" and out.text.startswith("{")


def test_bad_spec_raises_before_queueing_and_next_call_works(llm: LLM) -> None:
    bad = [
        so_params(json={"type": "object", "properties": {"a": {"type": "nonsense"}}}),
        so_params(regex="(unclosed"),
        so_params(grammar="start: undefined_rule"),
    ]
    for params in bad:
        with pytest.raises(ValueError, match="invalid structured output"):
            llm.generate([PROMPTS[0], PROMPTS[1]], [SamplingParams(), params], use_tqdm=False)
        assert not llm.engine.has_unfinished_requests()
    (out,) = generate(llm, PROMPTS[:1], so_params(regex=REGEX, temperature=0.0))[0]
    assert re.fullmatch(REGEX, out.text)


def test_unconstrained_neighbours_unchanged(llm: LLM) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = generate(llm, PROMPTS, plain)
    mixed = generate(llm, PROMPTS * 2, [plain] * 3 + [so_params(json=SCHEMA, temperature=0.0)] * 3)
    assert [o.token_ids for (o,) in mixed[:3]] == [o.token_ids for (o,) in alone]
    for (out,) in mixed[3:]:
        check_json(out.text)


def test_sync_and_async_scheduling_agree(llm: LLM, sync_llm: LLM) -> None:
    params = [so_params(json=SCHEMA, temperature=1.0, seed=7), so_params(regex=REGEX, seed=8)]
    outputs = {name: generate(e, PROMPTS[:2], params) for name, e in (("a", llm), ("s", sync_llm))}
    assert [o.token_ids for (o,) in outputs["a"]] == [o.token_ids for (o,) in outputs["s"]]


def test_n_samples_each_follow_the_grammar(llm: LLM) -> None:
    (outs,) = generate(llm, PROMPTS[:1], so_params(regex=REGEX, n=4, temperature=1.0, seed=5))
    assert len(outs) == 4
    for out in outs:
        assert re.fullmatch(REGEX, out.text), out.text
    assert len({o.text for o in outs}) > 1  # each sample its own matcher and draws


def test_min_tokens_logprobs_penalties_stop(llm: LLM) -> None:
    digits = r"[0-9]+"
    params = [
        so_params(regex=digits, min_tokens=6, max_tokens=20, temperature=1.0, seed=2),
        so_params(choice=CHOICES, logprobs=3, temperature=1.0, seed=2),
        so_params(json=SCHEMA, presence_penalty=1.5, repetition_penalty=1.3, temperature=0.0),
        so_params(regex=r"[a-z]{10}", stop=["q"], temperature=1.0, seed=9),
    ]
    (a,), (b,), (c,), (d,) = generate(llm, PROMPTS[:1] * 4, params)
    assert re.fullmatch(digits, a.text) and len(a.token_ids) >= 6
    assert b.text in CHOICES and len(b.logprobs) == len(b.token_ids)
    for token_id, entry in zip(b.token_ids, b.logprobs):
        # Logprobs are of the masked distribution: disallowed tokens have -inf.
        assert math.isfinite(entry[token_id].logprob)
        assert all(lp.logprob <= 0.0 for lp in entry.values())
    check_json(c.text)
    assert re.fullmatch(r"[a-z]{0,10}", d.text) and "q" not in d.text


def test_engine_side_compile_failure_fails_that_request_alone(llm: LLM) -> None:
    """A spec the frontend did not check (e.g. a compile that timed out in the engine):
    its request ends with finish reason 'error' and a message; its neighbour runs."""
    engine = llm.engine
    bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="("))
    good = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_requests(
        [EngineRequest("bad", [1, 2, 3], bad, 0.0), EngineRequest("good", [1, 2, 3], good, 0.0)]
    )
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.req_id] = out
    assert finished["bad"].finish_reason == "error" and "regex" in finished["bad"].error
    assert finished["good"].finish_reason == "length"


def test_preemption_keeps_outputs_valid(tiny_qwen3_dir: str) -> None:
    engine = LLM(tiny_qwen3_dir, device="cpu", num_gpu_blocks_override=16, block_size=4)
    try:
        params = so_params(json=SCHEMA, temperature=1.0, seed=11, max_tokens=30)
        outputs = generate(engine, PROMPTS * 2, params)
        assert engine.engine.stats().num_preemptions > 0
        for (out,) in outputs:
            check_json(out.text)
    finally:
        engine.shutdown()


@pytest.mark.usefixtures("ordered_dot")
def test_deterministic_mode_alone_equals_batched(tiny_qwen3_dir: str) -> None:
    """The deterministic engine (Triton attention and GEMMs in the interpreter on the CPU):
    a constrained request's tokens are the same alone and batched, chunked."""
    engine = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        attention_backend="triton",
        deterministic=True,
        block_size=8,
        max_num_batched_tokens=16,
    )
    try:
        target = so_params(regex=REGEX, temperature=1.0, seed=21)
        (alone,) = generate(engine, PROMPTS[:1], target)[0]
        others = [so_params(choice=CHOICES, temperature=1.0), SamplingParams(max_tokens=5)]
        batched = generate(engine, PROMPTS, [target, *others])
        assert batched[0][0].token_ids == alone.token_ids
        assert re.fullmatch(REGEX, alone.text)
    finally:
        engine.shutdown()


def test_data_parallel_replicas_compile_in_their_own_process(llm: LLM, tiny_qwen3_dir) -> None:
    """Each replica's core (its own process, as the server's core) loads the tokenizer from
    the config and builds its own backend; the tokens equal one in-process engine's."""
    params = [so_params(json=SCHEMA, temperature=0.0), so_params(choice=CHOICES, temperature=0.0)]
    expected = generate(llm, PROMPTS[:2], params)
    dp = LLM(tiny_qwen3_dir, device="cpu", data_parallel_size=2)
    try:
        outputs = generate(dp, PROMPTS[:2], params)
        assert [o.token_ids for (o,) in outputs] == [o.token_ids for (o,) in expected]
        assert [o.finish_reason for (o,) in outputs] == ["stop", "stop"]
    finally:
        dp.shutdown()
