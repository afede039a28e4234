"""Speculative decoding in the engine (ngram): the tokens and logprobs are the target's own, with
it on or off, alone and batched, with preemption, prefix caching and async scheduling; every KV
block is free afterwards; stops inside accepted drafts end the request where they would.

Outside deterministic mode a verify step's logits differ from a decode step's in the last bits
(another kernel computes them): tokens must be equal here, logprobs close; in deterministic
mode both are bit-identical (the last test)."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.kernels.ordered_dot import ordered_dot  # noqa: F401 (fixture)

# Repetitive prompts: the tiny random model's greedy text repeats too, so drafts get accepted.
PROMPTS = [([5, 6, 7, 8, 9] * 8)[: 10 + 3 * i] for i in range(5)]
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}


def _run(model_dir: str, params, prompts=PROMPTS, spec=None, per_request=False, **options):
    """(token ids, logprobs) per prompt, the speculation counters (with `per_request`, each
    request's accepted-token count instead), and whether every KV block was free after the run."""
    llm = LLM(model_dir, device="cpu", block_size=8, speculative_config=spec, **options)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    scheduler = llm.engine.scheduler
    if spec is not None:  # the engine's stats and the requests' metrics carry the same counters
        counters = scheduler.speculator.stats
        assert llm.engine.stats().spec_num_accepted_tokens == counters.num_accepted_tokens
        assert sum(o.metrics.num_draft_tokens for o in outs) == counters.num_draft_tokens
        assert sum(o.metrics.num_accepted_tokens for o in outs) == counters.num_accepted_tokens
    all_free = scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    stats = scheduler.speculator.stats if scheduler.speculator is not None else None
    if per_request:
        stats = [o.metrics.num_accepted_tokens for o in outs]
    llm.shutdown()
    results = []
    for out in outs:
        c = out.outputs[0]
        logprobs = [sorted((t, lp.logprob) for t, lp in e.items()) for e in c.logprobs or []]
        results.append((list(c.token_ids), logprobs, c.finish_reason))
    return results, stats, all_free


def _assert_same(got: list, ref: list) -> None:
    """Same tokens and finish reasons; logprobs equal to float32 rounding."""
    assert [(t, f) for t, _, f in got] == [(t, f) for t, _, f in ref]
    for (_, got_lp, _), (_, ref_lp, _) in zip(got, ref, strict=True):
        assert [[t for t, _ in e] for e in got_lp] == [[t for t, _ in e] for e in ref_lp]
        got_values = [v for e in got_lp for _, v in e]
        assert got_values == pytest.approx([v for e in ref_lp for _, v in e], abs=1e-5)


def _params(n: int = len(PROMPTS), **kw) -> list[SamplingParams]:
    base = {"temperature": 0.0, "max_tokens": 30, "ignore_eos": True}
    return [SamplingParams(**{**base, "logprobs": 2 if i % 2 else None, **kw}) for i in range(n)]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_greedy_same_tokens_and_logprobs(tiny_qwen3_dir: str, async_scheduling: bool) -> None:
    ref, _, _ = _run(tiny_qwen3_dir, _params(), async_scheduling=async_scheduling)
    got, stats, all_free = _run(
        tiny_qwen3_dir, _params(), spec=NGRAM, async_scheduling=async_scheduling
    )
    _assert_same(got, ref)
    assert stats.num_accepted_tokens > 0 and stats.num_accepted_tokens < stats.num_draft_tokens
    assert all_free


def test_alone_equals_batched(tiny_qwen3_dir: str) -> None:
    batched, _, _ = _run(tiny_qwen3_dir, _params(), spec=NGRAM)
    for i, prompt in enumerate(PROMPTS[:2]):
        alone, _, _ = _run(tiny_qwen3_dir, _params()[i : i + 1], [prompt], spec=NGRAM)
        _assert_same(alone, batched[i : i + 1])


def test_preemption_and_prefix_caching(tiny_qwen3_dir: str) -> None:
    # A shared 24-token prefix hits the cache; 14 blocks of 8 cannot hold all five at once.
    prompts = [[3] * 4 + ([5, 6, 7, 8, 9] * 4) + [10 + i] * (1 + i) for i in range(5)]
    ref, _, _ = _run(tiny_qwen3_dir, _params(), prompts)
    got, stats, all_free = _run(
        tiny_qwen3_dir, _params(), prompts, spec=NGRAM, num_gpu_blocks_override=14
    )
    _assert_same(got, ref)
    assert stats.num_accepted_tokens > 0 and all_free


def test_seeded_sampling_same_tokens(tiny_qwen3_dir: str) -> None:
    # A low temperature: drafts are accepted and rejected both; the seeded draws of rejected
    # positions must not shift the request's later draws.
    params = [
        SamplingParams(temperature=0.05, seed=i, max_tokens=30, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    ref, _, _ = _run(tiny_qwen3_dir, params)
    got, stats, _ = _run(tiny_qwen3_dir, params, spec=NGRAM)
    _assert_same(got, ref)
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_stop_inside_accepted_drafts(tiny_qwen3_dir: str) -> None:
    """A stop token, max_tokens and min_tokens end the request at the same token with drafts
    (the three variants batched in one run)."""
    ref, _, _ = _run(tiny_qwen3_dir, _params())
    # A token that first occurs some way into a greedy output, so that drafts may cover it.
    stop_id = next(t for t in ref[0][0][8:] if t not in ref[0][0][:8])
    params, prompts = [], []
    for kw in ({}, {"max_tokens": 13}, {"min_tokens": 9}):
        params += _params(**{"stop_token_ids": [stop_id], **kw})
        prompts += PROMPTS
    plain, _, _ = _run(tiny_qwen3_dir, params, prompts)
    got, _, all_free = _run(tiny_qwen3_dir, params, prompts, spec=NGRAM)
    _assert_same(got, plain)
    assert all_free
    assert plain[0][0][-1] == stop_id and len(plain[0][0]) > 9
    assert len(plain[len(PROMPTS)][0]) <= 13


def test_penalties_draft_and_keep_their_tokens(tiny_qwen3_dir: str) -> None:
    """Requests with presence, frequency and repetition penalties draft: each position is
    penalized as if the drafts before it were output, so the tokens are the target's own."""
    penalties = [
        {"repetition_penalty": 1.3},
        {"presence_penalty": 0.4, "frequency_penalty": 0.3},
        {"repetition_penalty": 0.9, "frequency_penalty": -0.2},
    ]
    params = [_params(1, **kw)[0] for kw in penalties] + _params(2)
    prompts = PROMPTS[:3] + PROMPTS[3:]
    ref, _, _ = _run(tiny_qwen3_dir, params, prompts)
    llm = LLM(tiny_qwen3_dir, device="cpu", block_size=8, speculative_config=NGRAM)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outs] == [t for t, _, _ in ref]
    penalized = [o.metrics for o in outs[:3]]  # they drafted, and kept some
    assert sum(m.num_draft_tokens for m in penalized) > 0
    assert sum(m.num_accepted_tokens for m in penalized) > 0


def test_stop_string_with_drafts(tiny_qwen3_dir: str) -> None:
    ref, _, _ = _run(tiny_qwen3_dir, _params())
    llm = LLM(tiny_qwen3_dir, device="cpu", block_size=8)
    text = llm.get_tokenizer().decode(ref[0][0][:12])
    llm.shutdown()
    stop = text[-3:]
    plain, _, _ = _run(tiny_qwen3_dir, _params(stop=[stop]))
    got, _, all_free = _run(tiny_qwen3_dir, _params(stop=[stop]), spec=NGRAM)
    _assert_same(got, plain)
    assert all_free and plain[0][2] == "stop"


def test_disable_by_batch_size(tiny_qwen3_dir: str) -> None:
    # Five requests start at once and end one by one: none drafts until at most two are left.
    params = [
        SamplingParams(temperature=0.0, max_tokens=6 + 6 * i, ignore_eos=True) for i in range(5)
    ]
    ref, _, _ = _run(tiny_qwen3_dir, params)
    _, always, _ = _run(tiny_qwen3_dir, params, spec=NGRAM)
    got, limited, _ = _run(tiny_qwen3_dir, params, spec={**NGRAM, "disable_by_batch_size": 2})
    _assert_same(got, ref)
    assert 0 < limited.num_drafts < always.num_drafts


def test_bad_speculative_config(tiny_qwen3_dir: str) -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(tiny_qwen3_dir, device="cpu", speculative_config={"method": "ngram"})
    with pytest.raises(ValueError, match="unknown speculative_config"):
        LLM(tiny_qwen3_dir, device="cpu", speculative_config={**NGRAM, "bogus": 1})


@pytest.mark.usefixtures("ordered_dot")
def test_deterministic_mode_bit_identical(tiny_qwen3_dir: str) -> None:
    """deterministic=True: a token's logits do not depend on the tokens computed with it, so
    tokens and logprobs are the same bits with speculation on and off, for greedy, seeded and
    penalized requests batched together; each of them has drafts accepted."""
    options = {"dtype": "float32", "attention_backend": "triton", "deterministic": True}
    params = [
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.05, seed=1, max_tokens=10, ignore_eos=True, logprobs=1),
        SamplingParams(
            temperature=0.0,
            max_tokens=10,
            ignore_eos=True,
            repetition_penalty=1.2,
            presence_penalty=0.3,
        ),
    ]
    prompts = PROMPTS[:3]
    ref, _, _ = _run(tiny_qwen3_dir, params, prompts, **options)
    got, accepted, all_free = _run(
        tiny_qwen3_dir, params, prompts, spec=NGRAM, per_request=True, **options
    )
    assert got == ref and all_free
    assert all(n > 0 for n in accepted), accepted


def test_constrained_requests_beside_drafting_ones(tiny_qwen3_dir: str) -> None:
    """A regex-constrained request batched with drafting ones: its mask lands on its own row
    (the drafting chunks have a row per position before it) and it is the same with
    speculation."""
    import re

    from minivllm.structured_output.params import StructuredOutputsParams

    pattern = r"[0-9]{6}-[a-c]{4}"
    constrained = SamplingParams(
        temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(regex=pattern)
    )
    params = [*_params(len(PROMPTS) - 1), constrained]
    ref, _, _ = _run(tiny_qwen3_dir, params)
    got, stats, all_free = _run(tiny_qwen3_dir, params, spec=NGRAM)
    _assert_same(got, ref)
    assert stats.num_accepted_tokens > 0 and all_free and got[-1][2] == "stop"
    llm = LLM(tiny_qwen3_dir, device="cpu")
    text = llm.get_tokenizer().decode(got[-1][0], skip_special_tokens=True)
    llm.shutdown()
    assert re.fullmatch(pattern, text), text


def test_constrained_request_drafts_under_its_masks(tiny_qwen3_dir: str) -> None:
    """A constrained request takes ngram drafts too, each position under its own grammar
    mask: the output is the same with speculation, valid, and some drafts are accepted."""
    import re

    from minivllm.structured_output.params import StructuredOutputsParams

    pattern = r"[ab]{30}"
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=40,
            logprobs=1,
            structured_outputs=StructuredOutputsParams(regex=pattern),
        )
    ]
    ref, _, _ = _run(tiny_qwen3_dir, params, PROMPTS[:1])
    got, stats, all_free = _run(tiny_qwen3_dir, params, PROMPTS[:1], spec=NGRAM)
    _assert_same(got, ref)
    assert all_free and 0 < stats.num_accepted_tokens
    llm = LLM(tiny_qwen3_dir, device="cpu")
    text = llm.get_tokenizer().decode(got[0][0], skip_special_tokens=True)
    llm.shutdown()
    assert re.fullmatch(pattern, text), text
