"""Speculator: which requests draft, their caps, and the back-off of failing ones. The drafts
come from the runner's proposer (here the n-gram one over the request's tokens, as the runner
calls it after a step) and the speculator decides which of them a request uses."""

from __future__ import annotations

from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.sched.speculation import MAX_BACKOFF_TOKENS, Speculator
from minivllm.engine.types import PLACEHOLDER_TOKEN_ID as PH
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
    after = RunnerOutput(["r"], [10], num_accepted_drafts=[1], num_draft_tokens=[3],
                         accepted_draft_ids=[[7]], draft_token_ids={"r": []})  # fmt: skip
    scheduler.update(drafted, after)
    assert request.output_token_ids == [6, 7, 10] and speculator.stats.num_accepted_tokens == 1
    (chunk,) = scheduler.schedule().chunks
    assert chunk.token_ids == [10] and chunk.num_draft_tokens == 0 and chunk.draft_cap == 0


class _InFlight:
    """A launched step's handle: result() is its RunnerOutput."""

    def __init__(self, out: RunnerOutput) -> None:
        self.out = out

    def result(self) -> RunnerOutput:
        return self.out


def _drafted(target: int, slots: int, accepted: list[int], proposals: list[int]) -> RunnerOutput:
    """r's output of a step with drafts: `slots` of them verified, `accepted` kept, then the
    target's token; `proposals` for the next step."""
    return RunnerOutput(["r"], [target], num_accepted_drafts=[len(accepted)],
                        num_draft_tokens=[slots], accepted_draft_ids=[accepted],
                        draft_token_ids={"r": proposals})  # fmt: skip


def test_async_draft_slots_and_their_corrections() -> None:
    """Async scheduling: a drafting request is scheduled while the step that drafts for it is
    in flight, with draft slots at positions that assume its drafts in flight accepted; each
    update() moves num_computed_tokens back by the slots not accepted and gives back their
    blocks (exact ids)."""
    speculator = Speculator(CONFIG, max_model_len=64)
    scheduler = AsyncScheduler(4, 64, 64, BlockManager(16, 4, False), speculator=speculator)
    request = Request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=20), 0.0)
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    assert scheduler.update(prefill, _InFlight(RunnerOutput(["r"], [6], draft_token_ids={
        "r": [7, 8, 9]}))) == []  # fmt: skip
    assert scheduler.can_schedule_ahead  # the step that asked drafts stays in flight
    s2 = scheduler.schedule()  # slots after the pending token 6
    (chunk,) = s2.chunks
    assert (chunk.token_ids, chunk.num_computed_tokens, chunk.num_draft_tokens) == ([PH] * 4, 5, 3)
    assert request.block_ids == [0, 1, 2]
    outputs = scheduler.update(s2, _InFlight(_drafted(10, 3, [7], [11, 12])))
    assert [o.new_token_ids for o in outputs] == [[6]]
    s3 = scheduler.schedule()  # s2's 3 drafts in flight: s3 starts as if all were accepted
    (chunk,) = s3.chunks
    assert (chunk.token_ids, chunk.num_computed_tokens, chunk.num_draft_tokens) == ([PH] * 4, 9, 3)
    assert request.block_ids == [0, 1, 2, 3]
    outputs = scheduler.update(s3, _InFlight(_drafted(13, 2, [11, 12], [14])))
    # s2 applied: 1 of its 3 slots accepted; s3 (in flight, moved back by 2 in the runner)
    # ends at 11; the block of the positions it no longer reaches is given back.
    assert [o.new_token_ids for o in outputs] == [[7, 10]]
    assert request.num_computed_tokens == 11 and request.block_ids == [0, 1, 2]
    s4 = scheduler.schedule()
    (chunk,) = s4.chunks
    assert (chunk.token_ids, chunk.num_computed_tokens, chunk.num_draft_tokens) == ([PH] * 4, 11, 3)
    assert request.block_ids == [0, 1, 2, 4]
    # s4 finishes at once (a RunnerOutput): s3, then s4 (one slot filled, rejected).
    outputs = scheduler.update(s4, _drafted(15, 1, [], []))
    assert [o.new_token_ids for o in outputs] == [[11, 12, 13], [15]]
    assert request.output_token_ids == [6, 7, 10, 11, 12, 13, 15]
    assert request.num_computed_tokens == request.num_tokens - 1 == 11
    assert request.block_ids == [0, 1, 2] and request.num_pending_drafts == 0
    stats = speculator.stats
    assert (stats.num_draft_tokens, stats.num_accepted_tokens) == (6, 3)
