"""Property (hypothesis): however a request ends (stop string, stop token, max_tokens, abort,
or preempted on the way) and whatever it asks for (logprobs, prompt logprobs, n, penalties),
under async scheduling the engine keeps running, frees every block, and the next request
gets the tokens it gets alone.

A request can end while its step is still in flight: the step launched after it must not
refer to it (a stop string with logprobs used to raise KeyError there, for good)."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from minivllm import LLM, SamplingParams
from minivllm.engine.types import EngineRequest
from minivllm.entrypoints.output_processor import OutputProcessor

MAX_TOKENS = 8
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [30, 31, 32], list(range(100, 113))]
PROBE = [40, 41, 42, 43]
ENDINGS = ("stop_string", "stop_token", "max_tokens", "abort")
RUN_IDS = itertools.count()  # request ids are not reused while the engine holds them

request_strategy = st.fixed_dictionaries(
    {
        "prompt": st.integers(0, len(PROMPTS) - 1),
        "ending": st.sampled_from(ENDINGS),
        "at": st.integers(0, MAX_TOKENS - 1),  # the token (or step) where it ends
        "logprobs": st.sampled_from([None, 0, 2]),
        "prompt_logprobs": st.sampled_from([None, 0, 1]),
        "n": st.integers(1, 2),
        "penalties": st.booleans(),
        "seeded": st.booleans(),
    }
)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str) -> LLM:
    # 10 blocks of 4 tokens for up to 6 sequences of up to 21 tokens: they preempt each other;
    # 6 tokens a step chunk every prompt.
    return LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        block_size=4,
        num_gpu_blocks_override=10,
        max_num_batched_tokens=6,
        max_num_seqs=4,
        async_scheduling=True,
    )


@pytest.fixture(scope="module")
def alone(llm: LLM):
    """prompt -> its greedy tokens (MAX_TOKENS, no stops) when it is the only request."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {
        tuple(p): llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0]
        .outputs[0]
        .token_ids
        for p in [*PROMPTS, PROBE]
    }


def _params(spec: dict, reference: list[int], llm: LLM) -> SamplingParams:
    stop_token = reference[spec["at"]]
    return SamplingParams(
        n=spec["n"],
        temperature=1.0 if spec["seeded"] else 0.0,
        seed=7 if spec["seeded"] else None,
        max_tokens=spec["at"] + 1 if spec["ending"] == "max_tokens" else MAX_TOKENS,
        ignore_eos=True,
        stop=[llm.tokenizer.decode([stop_token])] if spec["ending"] == "stop_string" else None,
        stop_token_ids=[stop_token] if spec["ending"] == "stop_token" else None,
        logprobs=spec["logprobs"],
        prompt_logprobs=spec["prompt_logprobs"],
        repetition_penalty=1.3 if spec["penalties"] else 1.0,
        presence_penalty=0.5 if spec["penalties"] else 0.0,
    )


def _run(llm: LLM, specs: list[dict], alone, run_id: int) -> dict[str, object]:
    """Drives the engine as LLM.generate does, aborting each 'abort' request at its step;
    returns the finished outputs by request index."""
    engine, processor = llm.engine, OutputProcessor(llm.tokenizer)
    abort_at: dict[int, list[str]] = {}
    for i, spec in enumerate(specs):
        prompt = PROMPTS[spec["prompt"]]
        params = _params(spec, alone[tuple(prompt)], llm)
        arrival = time.time()
        children = processor.add_request(f"{run_id}-{i}", None, prompt, params, arrival)
        engine.add_requests([EngineRequest(cid, prompt, p, arrival) for cid, p in children])
        if spec["ending"] == "abort":
            abort_at.setdefault(spec["at"], []).append(f"{run_id}-{i}")
    finished = {}
    step = 0
    while engine.has_unfinished_requests():
        for request_id in abort_at.pop(step, []):
            engine.abort_requests(processor.abort(request_id))
        outputs, to_abort = processor.process(engine.step())
        if to_abort:
            engine.abort_requests(to_abort)
        finished |= {out.request_id.split("-")[1]: out for out in outputs if out.finished}
        step += 1
    return finished


def _check_output(spec: dict, out, prompt: list[int], reference: list[int]) -> None:
    assert len(out.outputs) == spec["n"]
    for completion in out.outputs:
        assert completion.finish_reason in ("stop", "length")
        assert 1 <= len(completion.token_ids) <= MAX_TOKENS
        if spec["logprobs"] is not None:
            assert len(completion.logprobs) == len(completion.token_ids)
        if not spec["seeded"] and not spec["penalties"]:
            # Greedy: the tokens it gets alone, up to where it stopped.
            assert completion.token_ids == reference[: len(completion.token_ids)]
    if spec["prompt_logprobs"] is not None:
        assert len(out.prompt_logprobs) == len(prompt)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(request_strategy, min_size=1, max_size=3))
@example(  # the server reproduction: logprobs and a stop string matched after a few tokens
    [
        {
            "prompt": 0,
            "ending": "stop_string",
            "at": 2,
            "logprobs": 1,
            "prompt_logprobs": None,
            "n": 1,
            "penalties": False,
            "seeded": False,
        }
    ]
)
def test_any_ending_leaves_the_engine_serving_the_next_request(llm: LLM, alone, specs) -> None:
    finished = _run(llm, specs, alone, next(RUN_IDS))
    for i, spec in enumerate(specs):
        if spec["ending"] == "abort":
            continue  # forgotten by the frontend: no output to check
        prompt = PROMPTS[spec["prompt"]]
        _check_output(spec, finished[str(i)], prompt, alone[tuple(prompt)])
    block_manager = llm.engine.scheduler.block_manager
    assert block_manager.num_free_blocks == block_manager.num_blocks
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    probe = llm.generate({"prompt_token_ids": PROBE}, params, use_tqdm=False)
    assert probe[0].outputs[0].token_ids == alone[tuple(PROBE)]


def test_the_runner_forgets_every_ended_request(llm: LLM, alone) -> None:
    # However they end, once their ids reach the runner (the last step may be an empty one)
    # nothing of them stays behind there.
    specs = [
        {
            "prompt": p,
            "ending": ending,
            "at": 1,
            "logprobs": 0,
            "prompt_logprobs": 0,
            "n": 2,
            "penalties": False,
            "seeded": False,
        }
        for p, ending in [(0, "stop_string"), (1, "abort"), (2, "max_tokens")]
    ]
    _run(llm, specs, alone, next(RUN_IDS))
    llm.engine.step()  # an empty step: it hands the last finished ids to the runner
    runner = llm.engine.executor.runner
    assert runner.sampling_state.requests == {}
    assert runner.prompt_logprobs.num_done == {}
