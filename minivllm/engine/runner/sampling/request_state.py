"""What the runner keeps per request to sample it (RequestState), read from its SamplingParams
once, when the request arrives: a step's metadata gathers these per row."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.engine.runner.sampling.thinking_budget import ThinkingBudget
from minivllm.engine.types import NewRequestData
from minivllm.sampling_params import SamplingParams


@dataclass
class RequestState:
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int]
    generator: torch.Generator | None
    # Rows built for it so far (= tokens sampled). Counted at build time: with async
    # scheduling, output_token_ids can lag a step behind.
    num_sampled: int = 0
    slot: int = -1  # its row of the sampling state's RowTable
    thinking: ThinkingBudget | None = None  # with a thinking_token_budget
    # Read from params once, at add_request, for the paths that look at a row's request
    # (a step's parameters are gathered from the RowTable instead).
    is_random: bool = False
    has_penalties: bool = False
    # The ids min_tokens bans (stop ids, and EOS ids unless ignore_eos); empty without it.
    banned_early: tuple[int, ...] = ()


# The float parameters every row carries to the device: SamplingMetadata's name -> params'.
FLOAT_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "min_p": "min_p",
    "presence_penalties": "presence_penalty",
    "frequency_penalties": "frequency_penalty",
    "repetition_penalties": "repetition_penalty",
}


def new_state(new: NewRequestData, generator: torch.Generator | None) -> RequestState:
    """The state of a request as it arrives (generator: its seeded one, or None)."""
    params = new.sampling_params
    banned: tuple[int, ...] = ()
    if params.min_tokens:
        banned = tuple(params.stop_token_ids)
        if not params.ignore_eos:
            banned += tuple(params.eos_token_ids)
    return RequestState(
        list(new.prompt_token_ids),
        params,
        [],
        generator,
        is_random=not params.is_greedy,
        has_penalties=params.has_penalties,
        banned_early=banned,
    )


def follows_output(state: RequestState) -> bool:
    """Whether the request's banned or forced tokens follow its output (bad words, a thinking
    budget)."""
    return bool(state.params.bad_words_token_ids) or state.thinking is not None
