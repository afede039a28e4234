"""Synthetic acceptance (vLLM's benchmark mode): the number of accepted drafts follows the forced
unconditional rates (chi-square), whatever the target samples; rates of 1 keep every draft and
rates of 0 none; the new tokens are the kept drafts, then the target's own token. In the runner
(DraftedStep): a draft a grammar's mask bans is never kept, and the logprobs of a kept draft
are the draft's own, not those of the token the target sampled there."""

from __future__ import annotations

import torch

from minivllm.engine.runner.drafts.draft_step import DraftedStep, SyntheticAcceptance
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.verify import (
    position_rows,
    synthetic_conditional_rates,
    verify_synthetic,
)

VOCAB = 48
# The chi-square distribution's 0.999 quantile with 4 degrees of freedom.
CHI2_4DF_999 = 18.47


def _rows(num_rows: int, k: int, seed: int = 0):
    """num_rows rows of k drafts each, and target tokens that never equal a draft."""
    g = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, VOCAB // 2, (num_rows, k), generator=g)
    target = torch.randint(VOCAB // 2, VOCAB, (num_rows * (k + 1),), generator=g)
    return target, drafts, torch.full((num_rows,), k)


def _rates(unconditional: list[float]) -> torch.Tensor:
    return torch.tensor(synthetic_conditional_rates(unconditional), dtype=torch.float32)


def _chi_square(counts: torch.Tensor, unconditional: list[float]) -> float:
    """Pearson's statistic of num_accepted counts [k + 1] against the rates: P(a accepted) =
    p_{a-1} - p_a with p_{-1} = 1 and p_k = 0."""
    p = [1.0, *unconditional, 0.0]
    expected = torch.tensor([p[a] - p[a + 1] for a in range(len(p) - 1)]) * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_conditional_rates():
    assert synthetic_conditional_rates([1.0, 0.5, 0.0, 0.0]) == [1.0, 0.5, 0.0, 0.0]
    assert synthetic_conditional_rates([0.8, 0.4, 0.1]) == [0.8, 0.5, 0.25]
    assert synthetic_conditional_rates([0.0, 0.0]) == [0.0, 0.0]


def test_num_accepted_follows_the_rates():
    unconditional = [0.8, 0.5, 0.3, 0.1]
    target, drafts, num_draft = _rows(20_000, 4)
    generator = torch.Generator().manual_seed(1)
    out = verify_synthetic(target, drafts, num_draft, _rates(unconditional), generator)
    counts = torch.bincount(out.num_accepted, minlength=5).double()
    assert _chi_square(counts, unconditional) < CHI2_4DF_999
    # The test has the power to tell: rates 0.02 off are far outside the bound.
    assert _chi_square(counts, [0.78, 0.5, 0.3, 0.1]) > 2 * CHI2_4DF_999
    assert _chi_square(counts, [0.8, 0.5, 0.32, 0.12]) > 2 * CHI2_4DF_999
    # Per position, the unconditional rate: the fraction of rows that keep drafts 0..j.
    kept = (out.num_accepted[:, None] > torch.arange(4)).double().mean(0)
    assert torch.allclose(kept, torch.tensor(unconditional, dtype=torch.float64), atol=0.012)


def test_outputs_are_the_kept_drafts_then_the_targets_token():
    target, drafts, num_draft = _rows(64, 3, seed=2)
    num_draft[::4] = 0  # rows without drafts: one token of the target's
    num_draft[1::4] = 1
    total = int((num_draft + 1).sum())
    target = target[:total]
    out = verify_synthetic(target, drafts, num_draft, _rates([0.9, 0.6, 0.3]))
    rows = position_rows(num_draft, 3)
    for i, (a, row) in enumerate(zip(out.num_accepted.tolist(), out.output_token_ids.tolist())):
        assert a <= int(num_draft[i])
        assert row[:a] == drafts[i, :a].tolist()
        assert row[a] == int(target[rows[i, a]])
        assert row[a + 1 :] == [-1] * (3 - a)
    assert 0 < int(out.num_accepted.sum()) < int(num_draft.sum())


def test_rates_of_one_keep_everything_and_of_zero_nothing():
    target, drafts, num_draft = _rows(32, 4, seed=3)
    rows = position_rows(num_draft, 4)
    every = verify_synthetic(target, drafts, num_draft, _rates([1.0] * 4))
    assert every.num_accepted.tolist() == [4] * 32
    assert torch.equal(every.output_token_ids[:, :4], drafts)
    assert torch.equal(every.output_token_ids[:, 4], target[rows[:, 4]])
    none = verify_synthetic(target, drafts, num_draft, _rates([0.0] * 4))
    assert none.num_accepted.tolist() == [0] * 32
    assert torch.equal(none.output_token_ids[:, 0], target[rows[:, 0]])
    assert (none.output_token_ids[:, 1:] == -1).all()


def test_positions_past_the_rates_and_banned_drafts_are_rejected():
    target, drafts, num_draft = _rows(8, 4, seed=4)
    # Two rates for four drafts (a grammar's forced drafts may outnumber k): two kept at most.
    out = verify_synthetic(target, drafts, num_draft, _rates([1.0, 1.0]))
    assert out.num_accepted.tolist() == [2] * 8
    allowed = torch.ones(8, 4, dtype=torch.bool)
    allowed[0, 1] = False
    allowed[3, 0] = False
    out = verify_synthetic(target, drafts, num_draft, _rates([1.0] * 4), draft_allowed=allowed)
    assert out.num_accepted.tolist() == [1, 4, 4, 0, 4, 4, 4, 4]


def _drafted_step(rates: list[float], logits: torch.Tensor, drafts: list[list[int]]):
    """A DraftedStep over requests "a", "b" (greedy, logprobs=2) and its sampling state."""
    state = SamplingState("cpu")
    for req_id in ("a", "b"):
        params = SamplingParams(temperature=0.0, logprobs=2)
        state.add_request(NewRequestData(req_id, [1, 2, 3], params))
    num_draft = torch.tensor([len(d) for d in drafts])
    k = int(num_draft.max())
    draft_ids = torch.tensor([d + [-1] * (k - len(d)) for d in drafts])
    synthetic = SyntheticAcceptance(rates, torch.device("cpu"), seed=0)
    step = DraftedStep(
        state, Sampler(), logits, ["a", "b"], num_draft.numpy(), (draft_ids, num_draft), synthetic
    )
    return step, state


def test_drafted_step_keeps_drafts_with_their_own_logprobs():
    torch.manual_seed(5)
    drafts = [[7, 8, 9], [10]]
    logits = torch.randn(6, VOCAB)
    logits[:, 7:11] = -5.0  # no draft is the target's argmax anywhere
    logits[3, 0] = float("-inf")  # a banned token that is no draft changes nothing
    step, state = _drafted_step([1.0, 1.0, 1.0], logits, drafts)
    out = step.result()
    argmax = logits.argmax(-1).tolist()
    assert out.num_accepted_drafts == [3, 1]
    assert out.sampled_token_ids == [argmax[3], argmax[5]]
    assert state.requests["a"].output_token_ids == [7, 8, 9, argmax[3]]
    assert state.requests["b"].output_token_ids == [10, argmax[5]]
    assert [s.num_sampled for s in state.requests.values()] == [4, 2]
    logprobs = torch.log_softmax(logits, -1)
    for req, (row_start, tokens) in enumerate([(0, [7, 8, 9]), (4, [10])]):
        for j, token in enumerate(tokens):
            entry = out.draft_logprobs[req][j]
            row = logprobs[row_start + j]
            assert token in entry
            assert entry[token].logprob == float(row[token])
            assert entry[token].rank == int((row > row[token]).sum()) + 1
            top = row.topk(2).indices.tolist()
            assert all(t in entry for t in top)
    bonus = out.logprobs[0]
    assert argmax[3] in bonus and bonus[argmax[3]].rank == 1


def test_drafted_step_rejects_a_banned_draft():
    drafts = [[7, 8, 9], [10]]
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(6))
    logits[1, 8] = float("-inf")  # a grammar's mask bans draft 1 of "a" at its position
    step, state = _drafted_step([1.0, 1.0, 1.0], logits, drafts)
    out = step.result()
    assert out.num_accepted_drafts == [1, 1]
    assert out.sampled_token_ids[0] == int(logits[1].argmax())
    assert state.requests["a"].output_token_ids == [7, int(logits[1].argmax())]
    assert state.requests["a"].num_sampled == 2  # the rows past the rejection taken back
