"""Sampler: greedy, seeded, filtered sampling, penalties and logprobs against plain references."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import Sampler, SamplingMetadata, apply_penalties
from minivllm.layers.sampling_filters import apply_top_k_top_p
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output import StructuredOutputsParams


def make_state(
    params: list[SamplingParams],
    prompts: list[list[int]] | None = None,
    outputs: list[list[int]] | None = None,
) -> tuple[SamplingState, list[str]]:
    state = SamplingState("cpu")
    req_ids = [f"r{i}" for i in range(len(params))]
    for i, (req_id, p) in enumerate(zip(req_ids, params, strict=True)):
        state.add_request(NewRequestData(req_id, prompts[i] if prompts else [0], p))
        for token_id in outputs[i] if outputs else []:
            state.append_tokens([req_id], [token_id])
    return state, req_ids


def make_meta(params: list[SamplingParams], **kwargs) -> SamplingMetadata:
    state, req_ids = make_state(params, **kwargs)
    return state.build_metadata(req_ids)


def test_greedy_is_argmax_any_dtype():
    logits = torch.randn(5, 50)
    meta = make_meta([SamplingParams(temperature=0.0)] * 5)
    assert meta.all_greedy and meta.no_penalties
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = Sampler()(logits.to(dtype), meta)
        assert torch.equal(out.sampled_token_ids, logits.to(dtype).float().argmax(-1))
        assert out.logprobs is None


def test_top_k_1_equals_greedy_in_mixed_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 100)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, top_k=1)] * 3
    meta = make_meta(params)
    assert not meta.all_greedy and not meta.all_random
    for _ in range(5):
        assert torch.equal(Sampler()(logits, meta).sampled_token_ids, logits.argmax(-1))


def draw_sequence(seed: int, batch_with_others: bool, num_steps: int = 8) -> list[int]:
    """Tokens of a seeded request over num_steps, alone or in the middle of random rows."""
    target = SamplingParams(temperature=1.0, seed=seed, top_p=0.9)
    others = [SamplingParams(temperature=0.8), SamplingParams(temperature=1.2, top_k=5)]
    params = [others[0], target, others[1]] if batch_with_others else [target]
    state, req_ids = make_state(params)
    row = req_ids.index("r1") if batch_with_others else 0
    logits = torch.linspace(0.0, 2.0, 64).repeat(len(params), 1)
    tokens = []
    for _ in range(num_steps):
        sampled = Sampler()(logits, state.build_metadata(req_ids)).sampled_token_ids.tolist()
        for req_id, token_id in zip(req_ids, sampled, strict=True):
            state.append_tokens([req_id], [token_id])
        tokens.append(sampled[row])
    return tokens


def test_seed_is_independent_of_batch():
    torch.manual_seed(1)
    alone = draw_sequence(seed=7, batch_with_others=False)
    torch.manual_seed(2)  # a different default RNG state for the unseeded rows
    batched = draw_sequence(seed=7, batch_with_others=True)
    assert alone == batched
    assert draw_sequence(seed=7, batch_with_others=False) == alone
    assert draw_sequence(seed=8, batch_with_others=False) != alone


def reference_probs(logits: list[float], p: SamplingParams) -> list[float]:
    """Plain-Python vLLM semantics: temperature, top-k, top-p, then min-p, renormalized."""

    def normalize(weights: list[float]) -> list[float]:
        total = sum(weights)
        return [w / total for w in weights]

    probs = normalize([math.exp(x / p.temperature) for x in logits])
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if p.top_k:
        probs = normalize([w if i in order[: p.top_k] else 0.0 for i, w in enumerate(probs)])
    mass_before, keep = 0.0, set()
    for i in order:
        if mass_before < p.top_p:
            keep.add(i)
        mass_before += probs[i]
    probs = normalize([w if i in keep else 0.0 for i, w in enumerate(probs)])
    max_prob = max(probs)
    return normalize([w if w >= p.min_p * max_prob else 0.0 for w in probs])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=1.3, min_p=0.3),
        SamplingParams(temperature=0.9, top_k=5, top_p=0.8, min_p=0.1),
    ],
)
def test_filtered_sampling_matches_distribution(params):
    torch.manual_seed(3)
    logits_row = [2.0, 1.6, 1.1, 0.9, 0.3, -0.2, -0.7, -1.5]
    num_draws = 2000
    # Half the batch uses no filters: per-row parameters must not leak between rows.
    plain = SamplingParams(temperature=1.0)
    meta = make_meta([params] * num_draws + [plain] * num_draws)
    logits = torch.tensor(logits_row).repeat(2 * num_draws, 1)
    sampled = Sampler()(logits, meta).sampled_token_ids
    for rows, p in ((sampled[:num_draws], params), (sampled[num_draws:], plain)):
        expected = reference_probs(logits_row, p)
        counts = torch.bincount(rows, minlength=len(logits_row)).tolist()
        for token_id, (count, prob) in enumerate(zip(counts, expected, strict=True)):
            if prob == 0.0:
                assert count == 0, f"token {token_id} is outside the support"
            else:
                std = math.sqrt(prob * (1 - prob) / num_draws)
                assert abs(count / num_draws - prob) < 5 * std + 1e-3, (token_id, counts, expected)


def reference_penalties(
    logits: list[float], prompt: list[int], output: list[int], p: SamplingParams
) -> list[float]:
    result = []
    for token_id, x in enumerate(logits):
        count = output.count(token_id)
        if token_id in prompt or count:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        x -= p.frequency_penalty * count
        x -= p.presence_penalty * (count > 0)
        result.append(x)
    return result


def test_penalties_match_reference():
    torch.manual_seed(4)
    vocab_size = 16
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.5),
        SamplingParams(temperature=0.0, frequency_penalty=0.7, presence_penalty=-0.4),
        SamplingParams(temperature=0.0, repetition_penalty=0.8, presence_penalty=1.1),
        SamplingParams(temperature=0.0),
    ]
    prompts = [[1, 2, 2, 3], [4], [5, 6, 7, 8, 9, 10], [1]]
    outputs = [[3, 11, 11], [4, 4, 4, 12], [], [1, 2]]
    logits = torch.randn(len(params), vocab_size) * 3
    meta = make_meta(params, prompts=prompts, outputs=outputs)
    assert not meta.no_penalties
    penalized = apply_penalties(logits.clone(), meta)
    for row, p in enumerate(params):
        expected = reference_penalties(logits[row].tolist(), prompts[row], outputs[row], p)
        torch.testing.assert_close(penalized[row], torch.tensor(expected))
    # Greedy rows take the argmax of the penalized logits.
    assert torch.equal(Sampler()(logits, meta).sampled_token_ids, penalized.argmax(-1))


def test_logprobs_come_from_raw_logits():
    torch.manual_seed(5)
    logits = torch.randn(4, 30, dtype=torch.bfloat16)
    params = [
        SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=2.0),
        SamplingParams(temperature=0.5, logprobs=0),
        SamplingParams(temperature=2.0, top_k=4, logprobs=2),
        SamplingParams(temperature=1.0),
    ]
    meta = make_meta(params, outputs=[[1, 2], [], [3], []])
    assert meta.max_num_logprobs == 3
    out = Sampler()(logits, meta)
    raw = torch.log_softmax(logits.float(), dim=-1)
    # Only the three rows that asked are computed: the tensors hold those rows alone.
    assert meta.logprob_rows.tolist() == [0, 1, 2] and out.logprob_rows.tolist() == [0, 1, 2]
    assert out.logprob_token_ids.shape == (3, 4) and out.logprobs.dtype == torch.float32
    assert out.ranks.shape == (3,)
    asked = slice(0, 3)
    assert torch.equal(out.logprob_token_ids[asked, 0], out.sampled_token_ids[asked])
    torch.testing.assert_close(
        out.logprobs[asked], raw[asked].gather(1, out.logprob_token_ids[asked])
    )
    top_values, top_ids = raw[asked].topk(3, dim=-1)
    assert torch.equal(out.logprob_token_ids[asked, 1:], top_ids)
    for row in range(3):
        sampled = out.sampled_token_ids[row]
        expected_rank = int((raw[row] > raw[row, sampled]).sum()) + 1
        assert out.ranks[row].item() == expected_rank


def test_min_tokens_suppresses_eos_and_stop_tokens():
    logits = torch.zeros(3, 10)
    logits[:, 9] = 10.0  # EOS
    logits[:, 8] = 9.0  # a stop token id
    logits[:, 7] = 1.0
    base = dict(temperature=0.0, eos_token_ids=[9], stop_token_ids=[8], min_tokens=2)
    params = [
        SamplingParams(**base),
        SamplingParams(**base, ignore_eos=True),  # EOS is allowed, the stop token is not
        SamplingParams(temperature=0.0, eos_token_ids=[9], stop_token_ids=[8]),
    ]
    state, req_ids = make_state(params)
    for step, expected in enumerate(([7, 9, 9], [7, 9, 9], [9, 9, 9])):
        meta = state.build_metadata(req_ids)
        assert (meta.suppressed_token_ids is None) == (step == 2)  # min_tokens reached
        sampled = Sampler()(logits, meta).sampled_token_ids.tolist()
        assert sampled == expected
        for req_id, token_id in zip(req_ids, sampled, strict=True):
            state.append_tokens([req_id], [token_id])


def test_min_tokens_suppression_is_sampled_not_only_greedy():
    logits = torch.tensor([[0.0, 0.0, 6.0]]).repeat(500, 1)
    params = SamplingParams(temperature=1.0, eos_token_ids=[2], min_tokens=1)
    sampled = Sampler()(logits, make_meta([params] * 500)).sampled_token_ids
    assert (sampled != 2).all()
    assert set(sampled.tolist()) == {0, 1}


def test_logit_bias_is_added_before_sampling_and_logprobs_stay_raw():
    torch.manual_seed(1)
    logits = torch.randn(4, 30)
    top = logits.argmax(-1)
    params = [
        SamplingParams(temperature=0.0, logit_bias={7: 100.0}, logprobs=1),  # forced
        SamplingParams(temperature=0.0, logit_bias={int(top[1]): -100.0}),  # banned
        SamplingParams(temperature=0.0),  # no bias in the same batch
        SamplingParams(temperature=1.0, logit_bias={3: 100.0, 4: 0.5}),  # random row, forced
    ]
    meta = make_meta(params)
    assert not meta.is_plain and meta.logit_bias_ids.shape == (4, 2)
    out = Sampler()(logits, meta)
    sampled = out.sampled_token_ids.tolist()
    biased_second = logits[1].clone()
    biased_second[top[1]] -= 100.0
    assert sampled == [7, int(biased_second.argmax()), int(top[2]), 3]
    raw = torch.log_softmax(logits[0], -1)
    assert torch.allclose(out.logprobs[0, 0], raw[7])  # the sampled token, scored raw


def test_allowed_token_ids_keep_a_row_to_its_list_and_logprobs_stay_raw():
    torch.manual_seed(2)
    logits = torch.randn(4, 30).repeat(100, 1)  # 400 rows: random rows draw many times
    top = logits[:4].argmax(-1)
    params = [
        SamplingParams(temperature=0.0, allowed_token_ids=[3, 11], logprobs=1),
        SamplingParams(temperature=0.0),  # no list in the same batch
        SamplingParams(temperature=1.0, allowed_token_ids=[5, 6, 7]),
        SamplingParams(temperature=1.0, top_k=2, allowed_token_ids=[int(top[3]), 0]),
    ] * 100
    meta = make_meta(params)
    assert not meta.is_plain
    out = Sampler()(logits, meta)
    sampled = out.sampled_token_ids.view(100, 4)
    assert (sampled[:, 0] == (3 if logits[0, 3] > logits[0, 11] else 11)).all()
    assert (sampled[:, 1] == top[1]).all()
    assert set(sampled[:, 2].tolist()) == {5, 6, 7}  # drawn among the list, all of it
    assert set(sampled[:, 3].tolist()) <= {int(top[3]), 0}
    raw = torch.log_softmax(logits[0], -1)
    assert torch.allclose(out.logprobs[0, 0], raw[int(sampled[0, 0])])


def test_allowed_token_ids_are_checked():
    with pytest.raises(ValueError, match="empty"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(TypeError, match="list of token ids"):
        SamplingParams(allowed_token_ids=[1, "2"])
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(allowed_token_ids=[1], structured_outputs=StructuredOutputsParams(regex="a"))


def test_bad_words_ban_a_words_last_token_after_the_rest_step_by_step():
    # Words as token ids (the frontend's bad_words_token_ids): [4] always banned; [7, 8] bans
    # 8 right after a 7; [1, 2, 3] bans 3 after 1, 2. A row without bad words keeps its argmax.
    logits = torch.zeros(2, 10)
    logits[:, [3, 4, 8]] = torch.tensor([5.0, 6.0, 4.0])
    words = [[4], [7, 8], [1, 2, 3]]
    params = [
        SamplingParams(temperature=0.0, bad_words=["x"], bad_words_token_ids=words),
        SamplingParams(temperature=0.0),
    ]
    expected = {(): 3, (1, 2): 8, (7,): 3, (1, 2, 7): 3}  # output so far -> greedy token
    for output, token in expected.items():
        state, req_ids = make_state(params, outputs=[list(output), []])
        meta = state.build_metadata(req_ids)
        sampled = Sampler()(logits, meta).sampled_token_ids.tolist()
        assert sampled == [token, 4], output
    # One state, step after step: the banned tokens follow the output (no stale metadata).
    state, req_ids = make_state(params)
    for appended, token in ((None, 3), (1, 3), (2, 8), (7, 3)):
        if appended is not None:
            state.append_tokens(req_ids, [appended, 0])
        meta = state.build_metadata(req_ids)
        assert Sampler()(logits, meta).sampled_token_ids.tolist() == [token, 4], appended
    assert state.reads_output(req_ids[0]) and not state.reads_output(req_ids[1])


def test_logit_bias_values_are_checked():
    with pytest.raises(ValueError, match="finite"):
        SamplingParams(logit_bias={1: math.inf})
    with pytest.raises(TypeError, match="token ids to numbers"):
        SamplingParams(logit_bias={"1": 2.0})


@pytest.mark.parametrize(
    ("params", "is_plain"),
    [
        (SamplingParams(temperature=0.0), True),
        (SamplingParams(temperature=0.8, seed=3), True),
        (SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2), True),  # greedy
        (SamplingParams(temperature=0.8, top_k=5), False),
        (SamplingParams(temperature=0.8, top_p=0.9), False),
        (SamplingParams(temperature=0.8, min_p=0.1), False),
        (SamplingParams(temperature=0.0, presence_penalty=0.5), False),
        (SamplingParams(temperature=0.0, repetition_penalty=1.1), False),
        (SamplingParams(temperature=0.0, eos_token_ids=[2], min_tokens=1), False),
        (SamplingParams(temperature=0.0, logprobs=0), False),
        (SamplingParams(temperature=0.8, logit_bias={1: 2.0}), False),
    ],
)
def test_plain_flag(params, is_plain):
    """Plain batches (the fused kernel on CUDA) have every row greedy or temperature-only."""
    meta = make_meta([SamplingParams(temperature=1.0), params])
    assert meta.is_plain == is_plain
    assert (meta.seeds is not None) == (meta.offsets is not None) == is_plain


def test_plain_batch_on_cpu_takes_the_torch_path():
    """Without CUDA the kernel is not used: a plain batch samples exactly as a non-plain one."""
    logits = torch.randn(64, 40)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9)] * 32
    meta = make_meta(params)
    assert meta.is_plain
    torch.manual_seed(6)
    plain = Sampler()(logits, meta).sampled_token_ids
    torch.manual_seed(6)
    reference = Sampler()(logits, dataclasses.replace(meta, is_plain=False)).sampled_token_ids
    assert torch.equal(plain, reference)
    assert torch.equal(plain[::2], logits[::2].argmax(-1))
    assert not torch.equal(plain[1::2], logits[1::2].argmax(-1))


def test_top_p_that_rounds_to_zero_keeps_the_top_token() -> None:
    """top_p=1e-50 is valid but is 0.0 in float32: the most likely token must survive."""
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0]])
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([1e-50], dtype=torch.float32))
    assert torch.isfinite(out[0, 1]) and torch.isinf(out[0, [0, 2, 3]]).all()


def test_ban_tokens_sets_each_rows_ids_and_ignores_padding() -> None:
    from minivllm.layers.sampler import ban_tokens

    logits = torch.arange(12, dtype=torch.float32).reshape(2, 6)
    # Row 0 bans 3 and 0 beside a padding -1 (which points at id 0 too); row 1 bans 5,
    # and an id past the vocabulary is ignored.
    ban_tokens(logits, torch.tensor([[3, 0, -1], [5, 9, -1]]))
    inf = float("-inf")
    assert logits.tolist() == [[inf, 1, 2, inf, 4, 5], [6, 7, 8, 9, 10, inf]]
    # Padding alone leaves id 0 as it is.
    row = torch.ones(1, 4)
    ban_tokens(row, torch.tensor([[-1, -1]]))
    assert row.tolist() == [[1, 1, 1, 1]]
