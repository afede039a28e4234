"""A drafted position is sampled as if the drafts before it were output (DraftedStep): penalties
count them and min_tokens counts them, so exact verification keeps what decoding token by
token would."""

from __future__ import annotations

import torch

from minivllm.engine.runner.drafts.draft_step import DraftedStep
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import Sampler
from minivllm.sampling_params import SamplingParams

VOCAB = 16


def _verify(params: SamplingParams, logits: torch.Tensor, drafts: list[int], output=()):
    """One request with `drafts` over rows `logits` [len(drafts) + 1, VOCAB]; returns its
    accepted count and new tokens."""
    state = SamplingState("cpu")
    state.add_request(NewRequestData("a", [1, 2, 3], params))
    state.append_tokens(["a"] * len(output), list(output))
    num_draft = torch.tensor([len(drafts)])
    draft_ids = torch.tensor([drafts])
    step = DraftedStep(
        state,
        Sampler(),
        logits,
        ["a"],
        num_draft.numpy(),
        (draft_ids, num_draft),
        host_drafts=draft_ids.numpy(),
    )
    out = step.result()
    return out.num_accepted_drafts[0], state.requests["a"].output_token_ids[len(output) :]


def _logits(favourite: int, runner_up: int, gap: float = 0.5) -> torch.Tensor:
    """Three rows whose argmax is favourite, runner_up a gap behind."""
    logits = torch.zeros(3, VOCAB)
    logits[:, favourite] = 2.0
    logits[:, runner_up] = 2.0 - gap
    return logits


def test_presence_penalty_counts_the_drafts_before_a_position() -> None:
    # Drafts [5, 5]: 5 is the argmax at row 0; at row 1 the first draft's penalty (1.0 > the
    # 0.5 gap) makes 9 the target's token, so the second draft is rejected there.
    params = SamplingParams(temperature=0.0, presence_penalty=1.0)
    accepted, tokens = _verify(params, _logits(5, 9), [5, 5])
    assert (accepted, tokens) == (1, [5, 9])


def test_repetition_and_frequency_penalties_count_them() -> None:
    for params in (
        SamplingParams(temperature=0.0, repetition_penalty=2.0),
        SamplingParams(temperature=0.0, frequency_penalty=1.0),
    ):
        accepted, tokens = _verify(params, _logits(5, 9), [5, 5])
        assert (accepted, tokens) == (1, [5, 9]), params


def test_min_tokens_counts_the_drafts_as_output() -> None:
    # Stop token 5 is the argmax everywhere; min_tokens=2 bans it for the first two tokens:
    # after one output token, row 0 (the 2nd token) bans it, row 1 (the 3rd) does not.
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[5], ignore_eos=True)
    accepted, tokens = _verify(params, _logits(5, 9), [9, 5], output=[4])
    assert (accepted, tokens) == (2, [9, 5, 5])
    # Before that, the row after a draft is still under min_tokens: 5 is banned there.
    accepted, tokens = _verify(params, _logits(5, 9), [9, 5])
    assert (accepted, tokens) == (1, [9, 9])
