"""The thinking budget: the state read from the prompt and the output, token by token and
with drafts, and the forced end marker in the sampler (against its argmax)."""

from __future__ import annotations

import torch

from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.runner.sampling.thinking_budget import ThinkingBudget
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import Sampler
from minivllm.sampling_params import SamplingParams

START, END = [90, 91], [92, 93, 94]  # multi-token markers, as for a tokenizer without them


def test_budget_counts_inside_blocks_and_forces_the_end_marker_token_by_token():
    state = ThinkingBudget.after_prompt(3, START, END, [5, 90, 91, 7])  # prompt opened a block
    assert state.in_think and state.count == 1  # the prompt's token after the marker counts
    output = [8]
    state.read(output)
    assert state.forced_after([]) is None  # 2 of 3
    output.append(9)  # 3 of 3: the budget is spent
    state.read(output)
    assert state.forced_after([]) == 92
    assert state.forced_after([92]) == 93 and state.forced_after([92, 93]) == 94  # drafts
    assert state.count == 3 and state.num_seen == 2  # drafts were read on a copy
    output += [92, 93, 94]
    state.read(output)
    assert not state.in_think and state.forced_after([]) is None
    output += [1, 90, 91, 2]  # a new block: its own count
    state.read(output)
    assert state.in_think and state.count == 1 and state.forced_after([]) is None


def test_no_block_in_the_prompt_and_a_zero_budget():
    state = ThinkingBudget.after_prompt(0, START, END, [1, 2, 92, 93, 94])
    assert not state.in_think
    state.read([90, 91])
    assert state.forced_after([]) == 92  # opened with nothing to spend: closed at once
    closed = ThinkingBudget.after_prompt(5, START, END, [90, 91, 3, 92, 93, 94])
    assert not closed.in_think  # the template closed its block (thinking off)


def test_the_sampler_takes_the_forced_token_over_its_argmax():
    budget = SamplingParams(temperature=0.0, thinking_token_budget=1)
    budget.think_marker_ids = [START, END]
    free = SamplingParams(temperature=0.0)
    state = SamplingState("cpu")
    state.add_request(NewRequestData("b", [90, 91], budget))
    state.add_request(NewRequestData("f", [90, 91], free))
    assert state.reads_output("b") and not state.reads_output("f")
    logits = torch.zeros(2, 100)
    logits[:, 7] = 5.0
    sampler = Sampler()

    def sample() -> list[int]:
        return sampler(logits, state.build_metadata(["b", "f"])).sampled_token_ids.tolist()

    budget.bad_words, budget.bad_words_token_ids = ["x"], [[93]]  # cannot ban a forced token
    assert sample() == [7, 7]  # one token of budget
    state.append_tokens(["b", "f"], [7, 7])
    for token in (92, 93, 94):  # spent: the end marker, one token a step; then free again
        assert sample() == [token, 7]
        state.append_tokens(["b", "f"], [token, 7])
    assert sample() == [7, 7]
