"""SamplingState: per-request bookkeeping, metadata flags and tensors, logprob dicts."""

from __future__ import annotations

import torch

from minivllm.engine.sampling_state import SamplingState, prompt_logprobs_for
from minivllm.engine.types import Logprob, NewRequestData
from minivllm.layers.sampler import Sampler
from minivllm.sampling_params import SamplingParams


def new_state(*requests: tuple[str, list[int], SamplingParams]) -> SamplingState:
    state = SamplingState("cpu")
    for req_id, prompt, params in requests:
        state.add_request(NewRequestData(req_id, prompt, params))
    return state


def test_add_append_remove():
    state = new_state(("a", [1, 2], SamplingParams(seed=3)), ("b", [4], SamplingParams()))
    state.append_token("a", 7)
    # A request sent again (e.g. after preemption) keeps its outputs and generator.
    generator = state.requests["a"].generator
    state.add_request(NewRequestData("a", [1, 2], SamplingParams(seed=3)))
    assert state.requests["a"].output_token_ids == [7]
    assert state.requests["a"].generator is generator
    assert state.requests["b"].generator is None
    state.remove("a")
    state.remove("missing")  # finished requests the runner never saw are fine
    assert list(state.requests) == ["b"]


def test_generator_is_seeded():
    state = new_state(("a", [1], SamplingParams(seed=11)))
    expected = torch.empty(5).exponential_(generator=torch.Generator().manual_seed(11))
    actual = torch.empty(5).exponential_(generator=state.requests["a"].generator)
    assert torch.equal(actual, expected)


def test_metadata_plain_batch_builds_nothing_extra():
    state = new_state(
        ("g", [1], SamplingParams(temperature=0.0, top_k=5, seed=1)),
        ("r", [2], SamplingParams(temperature=0.5)),
    )
    meta = state.build_metadata(["r", "g"])
    assert not meta.all_greedy and not meta.all_random
    # The greedy row's top_k and seed do not matter: flags look at random rows only.
    assert meta.no_top_k and meta.no_top_p and meta.no_min_p and meta.no_penalties
    assert meta.max_top_k == 0 and meta.generators == {}
    assert meta.output_token_ids is None and meta.prompt_token_ids is None
    assert meta.suppressed_token_ids is None and meta.max_num_logprobs is None
    torch.testing.assert_close(meta.temperature, torch.tensor([0.5, 0.0]))
    assert meta.top_k.tolist() == [0, 5]


def test_metadata_penalty_and_filter_tensors():
    state = new_state(
        ("a", [1, 2, 3], SamplingParams(repetition_penalty=1.2, top_k=4, seed=5)),
        ("b", [4], SamplingParams(frequency_penalty=0.5, top_p=0.9, min_p=0.1, logprobs=2)),
        ("c", [5, 6], SamplingParams(temperature=0.0, logprobs=4)),
    )
    state.append_token("b", 8)
    state.append_token("b", 9)
    meta = state.build_metadata(["a", "b", "c"])
    assert meta.all_random is False and not meta.no_penalties
    assert not meta.no_top_k and not meta.no_top_p and not meta.no_min_p
    assert meta.max_top_k == 4 and meta.max_num_logprobs == 4
    assert meta.output_token_ids.tolist() == [[-1, -1], [8, 9], [-1, -1]]
    assert meta.prompt_token_ids.tolist() == [[1, 2, 3], [4, -1, -1], [5, 6, -1]]
    torch.testing.assert_close(meta.repetition_penalties, torch.tensor([1.2, 1.0, 1.0]))
    torch.testing.assert_close(meta.frequency_penalties, torch.tensor([0.0, 0.5, 0.0]))
    assert list(meta.generators) == [0]


def test_presence_only_skips_prompt_tensor():
    state = new_state(("a", [1, 2], SamplingParams(presence_penalty=0.5)))
    meta = state.build_metadata(["a"])
    assert meta.output_token_ids is not None and meta.prompt_token_ids is None


def test_to_runner_logprobs():
    torch.manual_seed(0)
    state = new_state(
        ("a", [1], SamplingParams(temperature=1.0, logprobs=2)),
        ("b", [1], SamplingParams(temperature=0.0)),
        ("c", [1], SamplingParams(temperature=0.0, logprobs=0)),
    )
    logits = torch.randn(3, 12)
    req_ids = ["a", "b", "c"]
    out = Sampler()(logits, state.build_metadata(req_ids))
    result = state.to_runner_logprobs(out, req_ids)
    raw = torch.log_softmax(logits, dim=-1)
    sampled = out.sampled_token_ids.tolist()
    assert result[1] is None
    assert result[2] == {sampled[2]: Logprob(raw[2, sampled[2]].item(), 1)}
    order = raw[0].argsort(descending=True).tolist()
    rank = order.index(sampled[0]) + 1
    assert list(result[0])[0] == sampled[0]
    expected = {sampled[0]: Logprob(raw[0, sampled[0]].item(), rank)}
    expected |= {t: Logprob(raw[0, t].item(), j + 1) for j, t in enumerate(order[:2])}
    assert result[0] == expected


def test_prompt_logprobs():
    torch.manual_seed(1)
    prompt = [3, 1, 4, 1, 5]
    logits = torch.randn(len(prompt) - 1, 8, dtype=torch.bfloat16)
    entries = prompt_logprobs_for(logits, prompt[1:], 1)
    raw = torch.log_softmax(logits.float(), dim=-1)
    assert len(entries) == 4
    for i, entry in enumerate(entries):
        token_id = prompt[i + 1]
        rank = int((raw[i] > raw[i, token_id]).sum()) + 1
        top = int(raw[i].argmax())
        assert entry[token_id] == Logprob(raw[i, token_id].item(), 1 if top == token_id else rank)
        assert entry[top] == Logprob(raw[i, top].item(), 1)
        assert len(entry) == (1 if top == token_id else 2)
