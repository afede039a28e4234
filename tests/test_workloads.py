"""benchmarks/workloads.py: the throughput workload shapes are seeded, sized as documented, and
the headline is exactly docs/performance.md's; batch-1 latency's procedure;
benchmarks/engine/profile_workload.py's runs and kernel kinds; agent_trace's ceiling."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks import workloads as workloads_module
from benchmarks.engine import profile_workload as profile_workload_module
from benchmarks.kernels import prefill_dispatch_model


@pytest.fixture(scope="module")
def workloads():
    return workloads_module


def _check_ranges(w, prompt_range, output_range) -> None:
    assert all(prompt_range[0] <= len(p) <= prompt_range[1] for p in w.prompts)
    assert all(output_range[0] <= n <= output_range[1] for n in w.output_lens)
    assert all(0 <= t <= 10000 for p in w.prompts for t in p)
    # Every request fits: the engines reject a prompt + output longer than max_model_len.
    assert max(len(p) + n for p, n in zip(w.prompts, w.output_lens)) <= w.max_model_len


def test_headline_is_perf_md(workloads) -> None:
    w = workloads.make_workload("headline")
    assert (w.num_requests, w.num_prompt_tokens, w.num_output_tokens) == (256, 142827, 133966)
    assert w.max_model_len == 4096
    _check_ranges(w, (100, 1024), (100, 1024))


def test_short_long_prefix_shapes(workloads) -> None:
    short = workloads.make_workload("short")
    assert short.num_requests == 4096
    _check_ranges(short, (16, 128), (16, 512))

    long = workloads.make_workload("long")
    assert long.num_requests == 16 and {len(p) for p in long.prompts} == {16384}
    _check_ranges(long, (16384, 16384), (32, 128))
    assert long.max_model_len >= 16384 + 128

    prefix = workloads.make_workload("prefix")
    assert prefix.num_requests == 512
    _check_ranges(prefix, (2048 + 64, 2048 + 256), (64, 256))
    uses = Counter(tuple(p[:2048]) for p in prefix.prompts)
    assert sorted(uses.values()) == [64] * 8
    # Shuffled: the first requests do not all share one prefix.
    assert len({tuple(p[:2048]) for p in prefix.prompts[:8]}) > 1


def test_chat_sends_what_real_requests_send(workloads) -> None:
    from minivllm import SamplingParams

    chat = workloads.make_workload("chat")
    assert chat.num_requests == 1000 and len(chat.sampling) == 1000
    _check_ranges(chat, (16, 3000), (8, 1000))
    # Log-normal: a long tail above the median.
    lens = sorted(len(p) for p in chat.prompts)
    assert 300 < lens[500] < 500 and lens[-1] > 4 * lens[500]
    assert all(o["top_k"] == 20 and o["top_p"] == 0.8 for o in chat.sampling)
    share = {
        name: sum(name in o for o in chat.sampling) / 1000
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs",
                     "min_tokens")
    }  # fmt: skip
    assert 0.2 < share.pop("repetition_penalty") < 0.3
    assert all(0.09 < v < 0.16 for v in share.values()), share
    for options in chat.sampling:  # every option is one SamplingParams takes
        SamplingParams(**options)
    plain = workloads.make_workload("chat-temperature")
    assert (plain.prompts, plain.output_lens) == (chat.prompts, chat.output_lens)
    assert plain.sampling == [{"temperature": 0.7}] * 1000
    qwen3 = workloads.make_workload("headline-qwen3")
    assert qwen3.prompts == workloads.make_workload("headline").prompts
    assert qwen3.sampling[0] == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


@pytest.mark.parametrize("name", ["headline", "short", "prefix", "chat"])
def test_seeded_and_sized(workloads, name) -> None:
    a, b = workloads.make_workload(name, 12), workloads.make_workload(name, 12)
    assert a == b and a.num_requests == 12
    assert workloads.make_workload(name, 12, seed=1) != a


def test_bad_requests_raise(workloads) -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.make_workload("huge")
    with pytest.raises(ValueError, match="num_requests"):
        workloads.make_workload("short", 0)


def test_result_fields(workloads) -> None:
    w = workloads.Workload("t", [[1, 2, 3], [4]], [6, 10], max_model_len=64)
    fields = workloads.result_fields(w, generated=16, seconds=2.0)
    assert fields["prompt_tokens"] == 4 and fields["output_tokens"] == 16
    assert fields["output_tok_s"] == 8.0 and fields["total_tok_s"] == 10.0
    assert fields["workload"] == "t" and fields["num_requests"] == 2
    early = workloads.result_fields(w, generated=12, seconds=2.0)  # requests that ended early
    assert early["output_tok_s"] == 8.0 and early["generated_tok_s"] == 6.0


@pytest.fixture(scope="module")
def profile_workload():
    return profile_workload_module


def test_shifted_runs_never_share_a_prompt(workloads) -> None:
    """Runs on one engine (profile_workload's warm-up, timed and profiled runs; the workloads of
    one peer_workload_bench call) take shifted ids: a run must not find the previous run's
    prompts in the prefix cache, and prefixes shared within a run stay shared (the prefix
    workload is about them)."""
    w = workloads.make_workload("prefix", 64)
    runs = [workloads.shifted(w, s) for s in (1, 2, 3)]
    assert all(r.output_lens == w.output_lens and r.sampling == w.sampling for r in runs)
    ids = [r.prompts for r in runs]
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert all(x[0] != y[0] for x, y in zip(ids[a], ids[b]))  # not even the first block
    for run in ids:
        assert [len(p) for p in run] == [len(p) for p in w.prompts]
        assert all(0 <= t <= workloads.MAX_TOKEN_ID for p in run for t in p)
        assert len({tuple(p[:2048]) for p in run}) == len({tuple(p[:2048]) for p in w.prompts})


def test_peer_bench_workloads_on_one_engine_share_no_prompt() -> None:
    """chat and chat-temperature have the same prompts: in one peer_workload_bench call the
    second must not hit the first's prefix cache."""
    from benchmarks.peer.peer_workload_bench import make_workloads

    made = make_workloads(["chat", "latency", "chat-temperature"], 8)
    assert list(made) == ["chat", "chat-temperature"]
    assert made["chat"].prompts == workloads_module.make_workload("chat", 8).prompts
    first = {tuple(p[:16]) for p in made["chat"].prompts}
    assert not first & {tuple(p[:16]) for p in made["chat-temperature"].prompts}


@pytest.mark.parametrize(
    "name,kind",
    [
        ("_prefill_kernel", "prefill_attention"),
        ("_decode_kernel", "decode_attention"),
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "gemm"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
        ("_rope_kernel", "rope_kv_store"),
        ("_rmsnorm_kernel", "norm"),
        ("_silu_and_mul_kernel", "activation"),
        ("_chunk_max_kernel", "sampler"),
        ("Memcpy HtoD (Pinned -> Device)", "other"),
    ],
)
def test_profile_kernel_kinds(profile_workload, name, kind) -> None:
    assert profile_workload.kind_of(name) == kind


def test_batch1_latency_warms_up_then_times_new_prompts(workloads) -> None:
    now, calls = [0.0], []

    def generate(prompt: list[int], max_tokens: int) -> None:
        calls.append((tuple(prompt), max_tokens))
        now[0] += 0.004 + 0.001 * (max_tokens - 1)  # a 4 ms first token, 1 ms each later one

    latency = workloads.measure_batch1(
        generate, ttft_samples=5, full_samples=2, clock=lambda: now[0]
    )
    out_len = workloads.LATENCY_OUTPUT_LEN
    assert [n for _, n in calls] == [8, 8] + [1] * 5 + [out_len + 1] * 2
    assert all(len(p) == workloads.LATENCY_PROMPT_LEN for p, _ in calls)
    assert len({p for p, _ in calls}) == len(calls)  # no prefix-cache hits
    fields = latency.fields()
    assert fields["ttft_ms"] == 4.0 and fields["tpot_ms"] == 1.0
    assert fields["ttft_q1_q3_ms"] == [4.0, 4.0]
    with pytest.raises(ValueError, match="samples"):
        workloads.measure_batch1(generate, ttft_samples=0)


@pytest.fixture(scope="module")
def dispatch_model():
    return prefill_dispatch_model


def test_dispatch_model_a_long_tile_started_last_runs_alone(dispatch_model) -> None:
    # A 16k prompt's chunk and 8 rows after another prompt's 16k keys: the 8 rows are one
    # tile as long as the chunk's last; started last, it runs alone past everything else.
    tail, chunk = (8, 16376), (16376, 0)
    late, bound = dispatch_model.launch_time([tail, chunk], 132)
    early, same_bound = dispatch_model.launch_time([chunk, tail], 132)
    assert bound == same_bound and early < 1.01 * bound
    assert late > early + 100  # most of a 129-block tile
    assert dispatch_model.tile_costs([(129, 0)]) == [1.5, 2.5]


def test_agent_trace_ceiling_is_what_an_ideal_prefix_cache_serves() -> None:
    """benchmarks/peer/agent_trace.py: through a stand-in engine whose cache serves each prompt's
    longest prefix of any sequence it has seen (prompts and answers), the hit rate equals the
    ceiling the trace reports."""
    import random
    from types import SimpleNamespace

    from benchmarks.peer.agent_trace import run_trace

    seen: list[list[int]] = []
    rng = random.Random(0)

    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def generate(prompts, max_tokens, use_tqdm):
        outputs = []
        for prompt, n in zip((p["prompt_token_ids"] for p in prompts), max_tokens):
            cached = max((common(prompt, s) for s in seen), default=0)
            answer = [rng.randint(10, 10_000) for _ in range(n)]
            seen.append(prompt + answer)
            sample = SimpleNamespace(token_ids=answer)
            outputs.append(SimpleNamespace(num_cached_tokens=cached, outputs=[sample]))
        return outputs

    llm = SimpleNamespace(generate=generate)
    result = run_trace(llm, lambda n, temperature: n, conversations=3, turns=3)
    assert result["hit_rate"] == result["hit_rate_ceiling"]
    assert 0.5 < result["hit_rate_ceiling"] < 1.0
