"""Speculator: which requests draft, their caps, and the back-off of failing ones. The drafts
come from the runner's proposer (here the n-gram one over the request's tokens, as the runner
calls it after a step) and the speculator decides which of them a request uses."""

from __future__ import annotations

from minivllm.engine.sched.block_manager import BlockManager
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.sched.speculation import MAX_BACKOFF_TOKENS, Speculator
from minivllm.engine.types import RunnerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import ProposeInput

CONFIG = SpeculativeConfig.from_dict(
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
)


def _decoding(prompt: list[int], outputs: list[int], **params) -> Request:
    """A request after its last update: every token but the last computed."""
    request = Request("r", prompt, SamplingParams(**{"max_tokens": 100, **params}), 0.0)
    for t in outputs:
        request.append_output_token(t)
    request.num_computed_tokens = request.num_tokens - 1
    return request


def _propose(speculator: Speculator, request: Request) -> dict[str, list[int]]:
    """req_id -> the drafts request uses this step: the proposer's (up to k, after its tokens,
    as the runner proposes them after a step), received and taken by the speculator."""
    proposer = NgramProposer.from_config(CONFIG)
    drafts = proposer.propose(ProposeInput.from_lists([request.all_token_ids])).to_lists()[0]
    speculator.receive(request, drafts)
    taken = speculator.take_drafts(request)
    return {request.req_id: taken} if taken else {}


def test_drafts_what_followed_the_last_match() -> None:
    speculator = Speculator(CONFIG, max_model_len=64)
    request = _decoding([1, 2, 3, 4, 5, 1, 2], [3])
    assert _propose(speculator, request) == {"r": [4, 5, 1]}


def test_caps_and_eligible_requests() -> None:
    speculator = Speculator(CONFIG, max_model_len=64)
    near_end = _decoding([1, 2, 3, 4, 5, 1, 2], [3], max_tokens=3)  # room for 1 draft
    assert _propose(speculator, near_end) == {"r": [4]}
    # Penalties and min_tokens do not stop drafting (each position counts the drafts before).
    penalized = _decoding([1, 2, 3, 4, 5, 1, 2], [3], presence_penalty=0.5, min_tokens=5)
    assert _propose(speculator, penalized) == {"r": [4, 5, 1]}
    assert speculator.is_due(penalized)
    first = _decoding([1, 2, 3, 4, 5, 1, 2, 3], [])  # no output token yet: a prefill first
    assert _propose(speculator, first) == {}
    in_flight = _decoding([1, 2, 3, 4, 5, 1, 2], [3])
    in_flight.num_pending_tokens = 1
    assert _propose(speculator, in_flight) == {}


def test_failing_requests_back_off_and_success_resets() -> None:
    speculator = Speculator(CONFIG, max_model_len=1000)
    request = _decoding(list(range(10, 30)), [40])  # nothing repeats: no draft
    waits = []
    for _ in range(7):
        assert speculator.is_due(request)
        assert _propose(speculator, request) == {}
        steps = 0
        while not speculator.is_due(request):
            request.append_output_token(50 + request.num_tokens)  # never repeats either
            request.num_computed_tokens += 1
            steps += 1
        waits.append(steps)
    # The failed step's own token, then 1, 2, 4, ... more before the next try.
    assert waits == [1 + w for w in (1, 2, 4, 8, 16, MAX_BACKOFF_TOKENS, MAX_BACKOFF_TOKENS)]
    speculator.observe(request, 3, 1)  # an accepted draft: due at once again
    assert speculator.is_due(request)


def test_scheduler_takes_the_runners_drafts_as_data() -> None:
    """The scheduler asks for drafts after a sampled chunk (draft_cap), takes the runner's
    answer from RunnerOutput.draft_token_ids, schedules them after the request's last token,
    and backs off when the runner found none."""
    speculator = Speculator(CONFIG, max_model_len=64)
    scheduler = Scheduler(4, 64, 64, BlockManager(16, 4, False), speculator=speculator)
    request = Request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=20), 0.0)
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    assert [c.draft_cap for c in prefill.chunks] == [3]
    scheduler.update(prefill, RunnerOutput(["r"], [6], draft_token_ids={"r": [7, 8, 9]}))
    drafted = scheduler.schedule()
    (chunk,) = drafted.chunks
    assert chunk.token_ids == [6, 7, 8, 9] and chunk.num_draft_tokens == 3
    # One draft accepted, then the target's 10; the runner found no drafts after them.
    after = RunnerOutput(["r"], [10], num_accepted_drafts=[1], draft_token_ids={"r": []})
    scheduler.update(drafted, after)
    assert request.output_token_ids == [6, 7, 10] and speculator.stats.num_accepted_tokens == 1
    (chunk,) = scheduler.schedule().chunks
    assert chunk.token_ids == [10] and chunk.num_draft_tokens == 0 and chunk.draft_cap == 0
