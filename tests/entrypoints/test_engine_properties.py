"""Engine-level property (hypothesis): random greedy workloads on the tiny model (fp32, CPU)
give every request the tokens it gets when run alone, while preemption, chunked prefill,
prefix-cache hits and speculative decoding (n-gram drafts, under async scheduling in draft
slots) reshape the schedule."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from minivllm import LLM, SamplingParams

MAX_TOKENS = 10
MAX_EXAMPLES = 20
MAX_PARAMS_EXAMPLES = 60
# Shared prefixes (some a whole number of 4-token blocks, some not) so that prompts hit the
# prefix cache of their neighbours and of earlier examples.
PREFIXES = [list(range(30, 46)), list(range(100, 109)), [5, 6, 7, 8, 9]]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}  # fmt: skip


@pytest.fixture(scope="module")
def alone(tiny_qwen3_dir: str):
    """prompt -> its greedy tokens (MAX_TOKENS of them) when it is the only request."""
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", enable_prefix_caching=False)
    cache: dict[tuple[int, ...], list[int]] = {}
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

    def tokens(prompt: list[int]) -> list[int]:
        if tuple(prompt) not in cache:
            out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
            cache[tuple(prompt)] = out[0].outputs[0].token_ids
        return cache[tuple(prompt)]

    return tokens


requests_strategy = st.lists(
    st.tuples(
        st.integers(0, len(PREFIXES) - 1),
        st.lists(st.integers(1, 400), max_size=6),  # suffix after the shared prefix
        st.integers(1, MAX_TOKENS),
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize(
    ("async_scheduling", "spec"),
    [(True, None), (False, None), (True, NGRAM), (False, NGRAM)],
    ids=["async", "sync", "async-ngram", "sync-ngram"],
)
def test_random_workloads_match_requests_run_alone(
    tiny_qwen3_dir: str, alone, async_scheduling: bool, spec: dict | None
) -> None:
    # 12 blocks of 4 tokens: a request needs up to 8, so a few together preempt each other;
    # 7 tokens a step chunks every prompt.
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        block_size=4,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=7,
        max_num_seqs=4,
        async_scheduling=async_scheduling,
        speculative_config=spec,
    )
    scheduler = llm.engine.scheduler
    schedule = scheduler.schedule
    num_slot_chunks = [0]  # chunks with draft slots: placeholders the runner fills

    def counting_schedule(*args, **kwargs):
        sched_out = schedule(*args, **kwargs)
        num_slot_chunks[0] += sum(
            1 for c in sched_out.chunks if c.num_draft_tokens and c.token_ids[-1] < 0
        )
        return sched_out

    scheduler.schedule = counting_schedule

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(requests_strategy)
    @example([(0, [1, 2, 3, 4, 5, 6], MAX_TOKENS)] * 4)  # 4 x 8 blocks: surely preempts
    def check(requests) -> None:
        prompts = [PREFIXES[i] + suffix for i, suffix, _ in requests]
        params = [
            SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for *_, m in requests
        ]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for prompt, p, out in zip(prompts, params, outs):
            assert out.outputs[0].token_ids == alone(prompt)[: p.max_tokens]
        assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks

    check()
    stats = (scheduler.num_preemptions, scheduler.prefix_cache_hits)
    print("WORKLOAD-PROPERTY", {"preemptions": stats[0], "prefix_hit_tokens": stats[1]})
    # The schedules under test happened: requests were preempted and hit the prefix cache.
    assert scheduler.num_preemptions > 0
    assert scheduler.prefix_cache_hits > 0
    if spec is not None:  # drafts were verified, some accepted, some rejected
        counters = scheduler.speculator.stats
        assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    assert (num_slot_chunks[0] > 0) == (spec is not None and async_scheduling)


EXTREME_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e-45, 1e-30, 1e-6, 2.0, 1e30, -1e-30]),
)
EXTREME_INTS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 2**31, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 2**70]),
)


# name -> (usual values, extreme values)
PARAM_SPACE = {
    "temperature": ([0.0, 0.7, 1.0], EXTREME_FLOATS),
    "top_p": ([1.0, 0.9, 0.5], EXTREME_FLOATS),
    "top_k": ([0, 5, 50], EXTREME_INTS),
    "min_p": ([0.0, 0.1], EXTREME_FLOATS),
    "presence_penalty": ([0.0, 1.0], EXTREME_FLOATS),
    "frequency_penalty": ([0.0, -1.0], EXTREME_FLOATS),
    "repetition_penalty": ([1.0, 1.3], EXTREME_FLOATS),
    "seed": ([None, 0, 7], EXTREME_INTS),
    "n": ([1, 2], st.integers(-1, 3)),
    "min_tokens": ([0, 2], st.integers(-1, 6)),
    "logprobs": ([None, 0, 3], EXTREME_INTS),
    "prompt_logprobs": ([None, 1], st.integers(-1, 30)),
    "stop_token_ids": ([[], [5]], st.lists(EXTREME_INTS, max_size=2)),
}


@st.composite
def sampling_kwargs(draw) -> dict:
    """Usual values everywhere but one or two parameters, which get extreme ones."""
    extreme = draw(st.sets(st.sampled_from(sorted(PARAM_SPACE)), min_size=1, max_size=2))
    return {
        name: draw(wild if name in extreme else st.sampled_from(usual))
        for name, (usual, wild) in PARAM_SPACE.items()
    }


def test_no_sampling_params_fail_a_step(tiny_qwen3_dir: str, alone) -> None:
    """Any SamplingParams is either refused where it is made (ValueError / TypeError) or runs:
    nothing raises inside a step (seed=2**70 used to fail the whole batch there), and a
    plain neighbour in the same batch gets its usual tokens."""
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", num_gpu_blocks_override=64)
    neighbour = PREFIXES[0]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    vocab = llm.engine.info.vocab_size
    outcomes = {"refused": 0, "ran": 0}

    @settings(
        max_examples=MAX_PARAMS_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(sampling_kwargs())
    def check(kwargs) -> None:
        try:
            params = SamplingParams(max_tokens=6, **kwargs)
            llm.validate_request([1, 2, 3], params)
        except (ValueError, TypeError):
            outcomes["refused"] += 1
            return
        outs = llm.generate(
            [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": neighbour}],
            [params, greedy],
            use_tqdm=False,
        )
        outcomes["ran"] += 1
        assert all(0 <= t < vocab for c in outs[0].outputs for t in c.token_ids)
        assert outs[1].outputs[0].token_ids == alone(neighbour)

    check()
    print("PARAMS-PROPERTY", outcomes)
    assert outcomes["refused"] > 0 and outcomes["ran"] > 0, outcomes
