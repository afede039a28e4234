"""SamplingState: per-request bookkeeping, metadata flags and tensors, logprob dicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.engine.runner.sampling.logprob_packing import (
    pack_logprobs,
    pack_prompt_logprobs,
    prompt_logprob_dicts,
    to_runner_logprobs,
)
from minivllm.engine.runner.sampling.prompt_logprobs import PromptLogprobsJob, PromptLogprobsTracker
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import DRAW_SHIFT, Sampler
from minivllm.outputs import Logprob
from minivllm.sampling_params import SamplingParams


def new_state(*requests: tuple[str, list[int], SamplingParams]) -> SamplingState:
    state = SamplingState("cpu")
    for req_id, prompt, params in requests:
        state.add_request(NewRequestData(req_id, prompt, params))
    return state


def test_add_append_remove():
    state = new_state(("a", [1, 2], SamplingParams(seed=3)), ("b", [4], SamplingParams()))
    state.append_tokens(["a"], [7])
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
    assert meta.penalty_rows is None and meta.output_counts is None
    assert meta.suppressed_token_ids is None and meta.max_num_logprobs is None
    torch.testing.assert_close(meta.temperature, torch.tensor([0.5, 0.0]))
    assert meta.top_k.tolist() == [0, 5]
    # Only the fused sampler's per-row draw keys: the unseeded row uses the step seed.
    assert meta.is_plain and meta.seeds.dtype == meta.offsets.dtype == torch.int64
    assert 0 <= meta.seeds[0].item() < 2**63 and meta.offsets[0].item() == 0


def test_draw_keys_per_step():
    state = new_state(
        ("u", [1], SamplingParams(temperature=1.0)),
        ("s", [2], SamplingParams(temperature=0.7, seed=-(2**63))),
        ("g", [3], SamplingParams(temperature=0.0)),
    )
    req_ids = ["u", "s", "g"]
    metas = [state.build_metadata(req_ids) for _ in range(3)]
    # Parameters are reused while the batch stays; only the draw keys are new each step.
    assert all(m.temperature is metas[0].temperature for m in metas)
    step_seeds = [m.seeds[0].item() for m in metas]
    assert len(set(step_seeds)) == 3
    for step, meta in enumerate(metas):
        assert meta.seeds[1].item() == -(2**63)  # any int64 seed, as is
        assert meta.offsets[:2].tolist() == [0, step << DRAW_SHIFT]
    # The step seeds come from the state's own generator: reproducible, not global.
    torch.manual_seed(99)
    again = new_state(("u", [1], SamplingParams(temperature=1.0)))
    assert [again.build_metadata(["u"]).seeds[0].item() for _ in range(3)] == step_seeds
    other = SamplingState("cpu", seed=1)
    other.add_request(NewRequestData("u", [1], SamplingParams(temperature=1.0)))
    assert other.build_metadata(["u"]).seeds[0].item() != step_seeds[0]


def test_num_sampled_counts_builds_not_appends():
    state = new_state(("s", [1], SamplingParams(temperature=1.0, seed=4)))
    state.build_metadata(["s"])
    # Async scheduling: step 2 is built before step 1's token is appended.
    meta = state.build_metadata(["s"])
    assert state.requests["s"].output_token_ids == []
    assert meta.offsets.tolist() == [1 << DRAW_SHIFT]
    state.append_tokens(["s", "s"], [5, 6])
    # A non-plain step counts too, so later plain steps keep their place in the stream.
    state.add_request(NewRequestData("t", [1], SamplingParams(top_p=0.5)))
    assert not state.build_metadata(["s", "t"]).is_plain
    assert state.build_metadata(["s"]).offsets.tolist() == [3 << DRAW_SHIFT]


def test_all_greedy_plain_metadata_is_reused_whole():
    state = new_state(("a", [1], SamplingParams(temperature=0.0, seed=3)))
    meta = state.build_metadata(["a"])
    assert meta.is_plain and meta.all_greedy and meta.seeds.tolist() == [0]
    assert state.build_metadata(["a"]) is meta


def test_seeded_request_repeats_in_any_plain_batch():
    """Through the fused kernel (Triton interpreter on CPU): same seed, same tokens."""
    from minivllm.kernels.sampling import sample_plain

    def tokens(batch_with_others: bool) -> list[int]:
        target = ("t", [1], SamplingParams(temperature=1.0, seed=21))
        others = [("a", [2], SamplingParams(temperature=0.5)), ("b", [3], SamplingParams())]
        requests = [others[0], target, others[1]] if batch_with_others else [target]
        state = new_state(*requests)
        req_ids = [r[0] for r in requests]
        logits = torch.zeros(len(req_ids), 300)  # uniform: every token is as likely
        result = []
        for _ in range(4):
            meta = state.build_metadata(req_ids)
            sampled = sample_plain(logits, meta.temperature, meta.seeds, meta.offsets, block=128)
            result.append(sampled[req_ids.index("t")].item())
        return result

    alone = tokens(batch_with_others=False)
    assert tokens(batch_with_others=True) == alone
    assert len(set(alone)) == 4  # a new draw each step


def test_metadata_penalty_and_filter_tensors():
    state = new_state(
        ("a", [1, 2, 3], SamplingParams(repetition_penalty=1.2, top_k=4, seed=5)),
        ("b", [4], SamplingParams(frequency_penalty=0.5, top_p=0.9, min_p=0.1, logprobs=2)),
        ("c", [5, 6], SamplingParams(temperature=0.0, logprobs=4)),
    )
    state.append_tokens(["b"], [8])
    state.append_tokens(["b"], [9])
    meta = state.build_metadata(["a", "b", "c"])
    assert meta.all_random is False and not meta.no_penalties
    assert not meta.no_top_k and not meta.no_top_p and not meta.no_min_p
    assert meta.max_top_k == 4 and meta.max_num_logprobs == 4
    # The penalized rows read their requests' slots of the tables: prompt tokens and output
    # counts, filled once from the host's copies.
    assert meta.penalty_rows.tolist() == [0, 1]
    slots = meta.penalty_slots.tolist()
    assert len(set(slots)) == 2
    assert meta.prompt_mask[slots[0]].nonzero().flatten().tolist() == [1, 2, 3]
    assert meta.prompt_mask[slots[1]].nonzero().flatten().tolist() == [4]
    assert meta.output_counts[slots[0]].count_nonzero() == 0
    assert meta.output_counts[slots[1]].nonzero().flatten().tolist() == [8, 9]
    torch.testing.assert_close(meta.repetition_penalties, torch.tensor([1.2, 1.0, 1.0]))
    torch.testing.assert_close(meta.frequency_penalties, torch.tensor([0.0, 0.5, 0.0]))
    assert list(meta.generators) == [0]


def test_penalty_tables_follow_the_device_records_and_host_appends():
    """A plain step's sampled tokens are counted on the device (record_sampled) before the
    host sees them; appending them later does not count them twice. A token appended that no
    record counted (a drafted step's) is counted once. A released slot is refilled from the
    host's copy of the next request that takes it."""
    state = SamplingState("cpu", max_num_seqs=1, vocab_size=16)
    state.add_request(NewRequestData("a", [1, 2], SamplingParams(frequency_penalty=1.0)))
    meta = state.build_metadata(["a"])
    state.record_sampled(meta, torch.tensor([5]))
    meta = state.build_metadata(["a"])  # async: built before step 1's token is appended
    slot = meta.penalty_slots.item()
    assert meta.output_counts[slot, 5] == 1
    state.append_tokens(["a"], [5])
    assert meta.output_counts[slot, 5] == 1
    state.append_tokens(["a"], [7])  # no record counted it
    assert meta.output_counts[slot].tolist() == [0] * 5 + [1, 0, 1] + [0] * 8
    state.add_request(NewRequestData("b", [3], SamplingParams(repetition_penalty=1.2)))
    state.add_request(NewRequestData("c", [4], SamplingParams()))
    state.append_tokens(["b"], [9])
    # One slot: "b" takes it from "a" (not in this step) and fills it from the host.
    meta = state.build_metadata(["b", "c"])
    assert meta.penalty_rows.tolist() == [0] and meta.penalty_slots.tolist() == [slot]
    assert meta.output_counts[slot].nonzero().flatten().tolist() == [9]
    assert meta.prompt_mask[slot].nonzero().flatten().tolist() == [3]
    meta = state.build_metadata(["a"])
    assert meta.output_counts[slot].nonzero().flatten().tolist() == [5, 7]


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
    num_logprobs = state.num_logprobs(req_ids)
    for req_id in req_ids:  # the requests may end before their step is read
        state.remove(req_id)
    result = to_runner_logprobs(pack_logprobs(out).tolist(), num_logprobs)
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
    packed = pack_prompt_logprobs(logits, torch.tensor(prompt[1:]), 1)
    entries = prompt_logprob_dicts(packed.tolist(), 1)
    raw = torch.log_softmax(logits.float(), dim=-1)
    assert len(entries) == 4
    for i, entry in enumerate(entries):
        token_id = prompt[i + 1]
        rank = int((raw[i] > raw[i, token_id]).sum()) + 1
        top = int(raw[i].argmax())
        assert entry[token_id] == Logprob(raw[i, token_id].item(), 1 if top == token_id else rank)
        assert entry[top] == Logprob(raw[i, top].item(), 1)
        assert len(entry) == (1 if top == token_id else 2)


def test_step_generator_moves_only_for_unseeded_rows():
    """A step whose sampled rows are all seeded draws nothing from the engine's step generator
    (the warm-up requests rely on it: engine/warm_up.py); an unseeded row draws once."""
    state = new_state(
        ("seeded", [1], SamplingParams(temperature=0.8, seed=5)),
        ("unseeded", [2], SamplingParams(temperature=0.8)),
    )
    before = state._step_generator.get_state().clone()
    meta = state.build_metadata(["seeded"])
    assert meta.seeds is not None and meta.seeds.tolist() == [5]
    assert torch.equal(state._step_generator.get_state(), before)
    state.build_metadata(["seeded", "unseeded"])
    assert not torch.equal(state._step_generator.get_state(), before)


@pytest.mark.parametrize("use_triton", [False, True])
def test_worst_case_sampling_of_the_memory_profile_leaves_nothing_behind(use_triton) -> None:
    # The memory profile samples every row with the largest workspaces (penalties, logprobs,
    # both top-k / top-p paths); the engine's state is as before afterwards.
    from minivllm.engine.runner.cache.profiling import sample_worst_case

    state = SamplingState("cpu", max_num_seqs=4, vocab_size=50)
    state.keyed_draws = use_triton  # as on CUDA, where the Triton sampler draws keyed noise
    state.add_request(NewRequestData("kept", [1, 2], SamplingParams(presence_penalty=1.0)))
    state.build_metadata(["kept"])
    slots = dict(state.penalties.slots)
    sample_worst_case(state, Sampler(use_triton), torch.randn(3, 50), max_logprobs=20)
    assert list(state.requests) == ["kept"]
    assert dict(state.penalties.slots) == slots and len(state.penalties.free) == 3


def test_prompt_logprobs_scored_a_few_rows_at_a_time_equal_one_pass():
    """PromptLogprobsTracker.score runs the LM head and the log_softmax over at most
    rows_per_pass rows at a time (their workspace stays a sampling step's): the same entries
    as one pass over every row."""
    torch.manual_seed(2)
    hidden = torch.randn(11, 6)
    head = torch.randn(30, 6)
    widths = []

    def compute_logits(rows: torch.Tensor) -> torch.Tensor:
        widths.append(rows.shape[0])
        return rows @ head.T

    jobs = [
        PromptLogprobsJob("a", np.arange(7), list(range(1, 8)), 2, is_first=True),
        PromptLogprobsJob("b", np.arange(4), [5, 9, 2, 2], 0, is_first=False),
    ]
    chunked = PromptLogprobsTracker.collect(
        jobs, PromptLogprobsTracker.score(jobs, hidden, compute_logits, 3)
    )
    assert max(widths) == 3 and sum(widths) == 11
    whole = PromptLogprobsTracker.collect(
        jobs, PromptLogprobsTracker.score(jobs, hidden, compute_logits, 100)
    )
    for req_id in ("a", "b"):  # a GEMM of fewer rows may round the last bits apart
        for got, expected in zip(chunked[req_id], whole[req_id], strict=True):
            if expected is None:
                assert got is None
                continue
            assert [(t, e.rank) for t, e in got.items()] == [
                (t, e.rank) for t, e in expected.items()
            ]
            assert [e.logprob for e in got.values()] == pytest.approx(
                [e.logprob for e in expected.values()], abs=1e-5
            )
    assert chunked["a"][0] is None and len(chunked["a"]) == 8 and len(chunked["b"]) == 4
    raw = torch.log_softmax(hidden[7:] @ head.T, dim=-1)
    assert chunked["b"][1][9].logprob == pytest.approx(raw[1, 9].item())


@pytest.mark.parametrize("tokens_first", [False, True])
def test_min_tokens_bans_until_reached_and_then_no_row_is_looked_at(tokens_first, monkeypatch):
    """A row bans its stop ids while fewer than min_tokens rows were built before it (its
    output, the steps in flight included); after that the step skips the per-row ban pass."""
    from minivllm.engine.runner.sampling import sampling_state as module

    params = SamplingParams(min_tokens=3, stop_token_ids=[5], temperature=0.0)
    state = new_state(("a", [1], params), ("b", [1], SamplingParams(temperature=0.0)))
    passes = []
    real = module.suppressed_token_ids
    monkeypatch.setattr(
        module, "suppressed_token_ids", lambda *a, **k: passes.append(1) or real(*a, **k)
    )
    banned = []
    for step in range(5):
        meta = state.build_metadata(["a", "b"])
        ids = meta.suppressed_token_ids
        banned.append(None if ids is None else ids[0].tolist())
        if tokens_first or step % 2:  # async scheduling: the output may lag a step behind
            state.append_tokens(["a", "b"], [7, 7])
    assert banned[:3] == [[5], [5], [5]] and banned[3:] == [None, None]
    assert len(passes) == 3
