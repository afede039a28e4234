"""Engine-level property (hypothesis): random greedy workloads on the tiny model (fp32, CPU)
give every request the tokens it gets when run alone, while preemption, chunked prefill and
prefix-cache hits reshape the schedule."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm import LLM, SamplingParams

MAX_TOKENS = 10
MAX_EXAMPLES = 20
# Shared prefixes (some a whole number of 4-token blocks, some not) so that prompts hit the
# prefix cache of their neighbours and of earlier examples.
PREFIXES = [list(range(30, 46)), list(range(100, 109)), [5, 6, 7, 8, 9]]


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


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_random_workloads_match_requests_run_alone(
    tiny_qwen3_dir: str, alone, async_scheduling: bool
) -> None:
    # 14 blocks of 4 tokens: a request needs up to 8, so a few together preempt each other;
    # 7 tokens a step chunks every prompt.
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        block_size=4,
        num_gpu_blocks_override=14,
        max_num_batched_tokens=7,
        max_num_seqs=4,
        async_scheduling=async_scheduling,
    )
    scheduler = llm.engine.scheduler

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(requests_strategy)
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
    # The schedules under test happened: requests were preempted and hit the prefix cache.
    assert scheduler.num_preemptions > 0
    assert scheduler.prefix_cache_hits > 0
