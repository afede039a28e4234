"""Scheduler: chunked prefill, decode-first order, prefill packing order, seats, preemption,
stops, abort, no leaks."""

from __future__ import annotations

import random

import pytest

from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.outputs import Logprob
from minivllm.sampling_params import SamplingParams

BLOCK_SIZE = 4


class TrackingScheduler(Scheduler):
    """A Scheduler that also keeps the runner's view of each request's block table, rebuilt
    from the chunks' new blocks, and sets chunk.block_ids to the whole table it sees."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.runner_tables: dict[str, list[int]] = {}

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        sched_out = super().schedule(now)
        for c in sched_out.chunks:
            table = self.runner_tables.get(c.req_id, [])[: c.num_prior_blocks] + c.new_block_ids
            self.runner_tables[c.req_id] = table
            c.block_ids = table
        return sched_out


def make_scheduler(
    num_blocks: int = 16,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    enable_prefix_caching: bool = False,
) -> Scheduler:
    manager = BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching)
    return TrackingScheduler(max_num_seqs, max_num_batched_tokens, max_model_len, manager)


def make_request(req_id: str, prompt_token_ids: list[int], **params) -> Request:
    params.setdefault("max_tokens", 16)
    return Request(req_id, prompt_token_ids, SamplingParams(**params), arrival_time=0.0)


def fake_run(sched_out: SchedulerOutput, token_id: int = 7) -> RunnerOutput:
    req_ids = [c.req_id for c in sched_out.chunks if c.sample]
    return RunnerOutput(req_ids=req_ids, sampled_token_ids=[token_id] * len(req_ids))


def step(scheduler: Scheduler, token_id: int = 7):
    sched_out = scheduler.schedule()
    outputs = scheduler.update(sched_out, fake_run(sched_out, token_id))
    return sched_out, outputs


def summary(sched_out: SchedulerOutput) -> list[tuple]:
    """(req_id, num tokens, num_computed_tokens, block_ids, sample) per chunk."""
    return [
        (c.req_id, len(c.token_ids), c.num_computed_tokens, c.block_ids, c.sample)
        for c in sched_out.chunks
    ]


def test_chunked_prefill_with_tiny_budget():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    a = make_request("a", list(range(10)), max_tokens=2)
    scheduler.add_request(a)
    sched_out, outputs = step(scheduler)
    assert summary(sched_out) == [("a", 4, 0, [0], False)]
    assert sched_out.chunks[0].token_ids == [0, 1, 2, 3]
    assert [r.req_id for r in sched_out.new_requests] == ["a"]
    assert sched_out.num_decode_chunks == 0 and outputs == []
    sched_out, outputs = step(scheduler)
    assert summary(sched_out) == [("a", 4, 4, [0, 1], False)]
    assert sched_out.new_requests == [] and outputs == []
    sched_out, outputs = step(scheduler)
    assert summary(sched_out) == [("a", 2, 8, [0, 1, 2], True)]
    assert sched_out.chunks[0].token_ids == [8, 9]
    assert [(o.req_id, o.new_token_ids, o.finished) for o in outputs] == [("a", [7], False)]
    sched_out, outputs = step(scheduler)
    assert summary(sched_out) == [("a", 1, 10, [0, 1, 2], True)]
    assert sched_out.num_decode_chunks == 1
    assert (outputs[0].finished, outputs[0].finish_reason) == (True, "length")
    assert a.output_token_ids == [7, 7] and a.block_ids == []
    sched_out, outputs = step(scheduler)
    assert sched_out.is_empty and sched_out.finished_req_ids == ["a"]
    assert not scheduler.has_unfinished_requests()
    assert scheduler.block_manager.num_free_blocks == 16


def test_budget_is_shared_running_first_then_waiting():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", list(range(6))))
    scheduler.add_request(make_request("b", [20, 21, 22]))
    sched_out, _ = step(scheduler)
    assert summary(sched_out) == [("a", 4, 0, [0], False)]
    sched_out, _ = step(scheduler)
    # a (running) took its 2 tokens first, b the rest; packed by where the context ends.
    assert summary(sched_out) == [("b", 2, 0, [2], False), ("a", 2, 4, [0, 1], True)]
    sched_out, _ = step(scheduler)
    # b's last prompt token is one token but not a decode: it is still prefill.
    assert summary(sched_out) == [("a", 1, 6, [0, 1], True), ("b", 1, 2, [2], True)]
    assert sched_out.num_decode_chunks == 1


def test_prefill_chunks_are_packed_by_where_their_context_ends():
    # A prompt's last few tokens after a long context end later than a new prompt's chunk:
    # packed last, their attention tile (as long as any) starts first (tiles run last-first).
    scheduler = make_scheduler(max_num_batched_tokens=10)
    scheduler.add_request(make_request("long", list(range(12))))
    scheduler.add_request(make_request("new", list(range(100, 105))))
    scheduler.add_request(make_request("short", [7, 8]))
    sched_out, _ = step(scheduler)
    assert summary(sched_out) == [("long", 10, 0, [0, 1, 2], False)]
    sched_out, _ = step(scheduler)
    assert [(c.req_id, c.num_computed_tokens + len(c.token_ids)) for c in sched_out.chunks] == [
        ("short", 2),
        ("new", 5),
        ("long", 12),
    ]
    assert sched_out.num_decode_chunks == 0


def test_decode_chunks_come_first_in_a_mixed_batch():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [1, 2, 3]))
    scheduler.add_request(make_request("b", [4, 5, 6, 7, 8]))
    step(scheduler)
    scheduler.add_request(make_request("c", list(range(6))))
    sched_out, outputs = step(scheduler)
    assert summary(sched_out) == [
        ("a", 1, 3, [0], True),
        ("b", 1, 5, [1, 2], True),
        ("c", 6, 0, [3, 4], True),
    ]
    assert sched_out.num_decode_chunks == 2
    assert [r.req_id for r in sched_out.new_requests] == ["c"]
    assert [o.req_id for o in outputs] == ["a", "b", "c"]


def test_readmitted_decode_moves_ahead_of_a_running_prefill():
    scheduler = make_scheduler(max_num_batched_tokens=10, enable_prefix_caching=True)
    scheduler.add_request(make_request("w", [1, 2, 3, 4, 5]))
    scheduler.add_request(make_request("q", list(range(20, 32))))
    sched_out, _ = step(scheduler)
    assert summary(sched_out) == [("w", 5, 0, [0, 1], True), ("q", 5, 0, [2, 3], False)]
    # v is what a preemption leaves behind: a prompt plus one output token, nothing computed.
    v = make_request("v", [1, 2, 3, 4])
    v.append_output_token(7)
    scheduler.add_request(v)
    sched_out, _ = step(scheduler)
    # v hits w's first block and computes only its output token: a decode, so it goes first.
    assert summary(sched_out) == [
        ("w", 1, 5, [0, 1], True),
        ("v", 1, 4, [0, 5], True),
        ("q", 7, 5, [2, 3, 4], True),
    ]
    assert sched_out.num_decode_chunks == 2
    assert v.num_cached_tokens == 4


def test_max_num_seqs_limits_seats():
    scheduler = make_scheduler(max_num_seqs=2)
    for req_id in "abc":
        scheduler.add_request(make_request(req_id, [1, 2], max_tokens=2))
    sched_out, _ = step(scheduler)
    assert [c.req_id for c in sched_out.chunks] == ["a", "b"]
    sched_out, outputs = step(scheduler)
    assert [c.req_id for c in sched_out.chunks] == ["a", "b"]
    assert all(o.finished for o in outputs)
    sched_out, _ = step(scheduler)
    # Never-used blocks go before freed ones (those stay cached for as long as possible).
    assert summary(sched_out) == [("c", 2, 0, [2], True)]
    assert sched_out.finished_req_ids == ["a", "b"]


def test_preemption_newest_victim_first_to_the_front_of_waiting():
    scheduler = make_scheduler(num_blocks=4)
    requests = [make_request(req_id, [i] * 4, max_tokens=6) for i, req_id in enumerate("abc")]
    for request in requests:
        scheduler.add_request(request)
    a, b, c = requests
    sched_out, _ = step(scheduler)
    assert [r.block_ids for r in requests] == [[0], [1], [2]]
    sched_out, _ = step(scheduler)
    # a takes the last free block; b needs one too, so c (newest) is preempted for it.
    assert summary(sched_out) == [("a", 1, 4, [0, 3], True), ("b", 1, 4, [1, 2], True)]
    assert c.status == RequestStatus.WAITING and c.num_computed_tokens == 0
    assert c.block_ids == [] and c.num_preemptions == 1
    assert sched_out.preempted_req_ids == ["c"]  # the runner frees what it holds of c
    assert list(scheduler.waiting) == [c] and scheduler.running == [a, b]
    for _ in range(3):
        sched_out, _ = step(scheduler)  # positions 5..7 fit; c still finds no free block
        assert [x.req_id for x in sched_out.chunks] == ["a", "b"]
        assert sched_out.preempted_req_ids == []
    sched_out, outputs = step(scheduler)
    # Position 8 of a needs a block: b, now newest, is preempted and its blocks freed
    # tail first (2, then 1); a gets the front one. b goes ahead of c.
    assert summary(sched_out) == [("a", 1, 8, [0, 3, 2], True)]
    assert list(scheduler.waiting) == [b, c] and b.block_ids == []
    assert outputs[0].finished and a.num_output_tokens == 6  # frees 2, 3, 0 behind 1
    sched_out, outputs = step(scheduler)
    # b recomputes prompt + 5 outputs; c still does not fit after it.
    assert summary(sched_out) == [("b", 9, 0, [1, 2, 3], True)]
    assert sched_out.chunks[0].token_ids == [1] * 4 + [7] * 5
    assert sched_out.new_requests == []  # not new again after a preemption
    assert outputs[0].finished and b.num_output_tokens == 6
    sched_out, _ = step(scheduler)
    assert summary(sched_out) == [("c", 5, 0, [0, 3], True)]
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert [r.output_token_ids for r in requests] == [[7] * 6] * 3
    assert scheduler.block_manager.num_free_blocks == 4


def test_running_request_can_preempt_itself():
    scheduler = make_scheduler(num_blocks=4)
    a = make_request("a", [1] * 4, max_tokens=4)
    b = make_request("b", [2] * 7, max_tokens=4)
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler)
    assert (a.block_ids, b.block_ids) == ([0], [1, 2])
    step(scheduler)
    assert (a.block_ids, b.block_ids) == ([0, 3], [1, 2])
    sched_out, _ = step(scheduler)
    # b needs a block for position 8; it is the newest, so it preempts itself.
    assert summary(sched_out) == [("a", 1, 5, [0, 3], True)]
    assert b.status == RequestStatus.WAITING and list(scheduler.waiting) == [b]
    sched_out, outputs = step(scheduler)  # b needs 3 blocks, 2 are free
    assert [c.req_id for c in sched_out.chunks] == ["a"] and outputs[0].finished
    sched_out, _ = step(scheduler)
    # a freed 3 then 0 behind b's 2 and 1: free queue 2, 1, 3, 0.
    assert summary(sched_out) == [("b", 9, 0, [2, 1, 3], True)]
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert b.output_token_ids == [7] * 4
    assert scheduler.block_manager.num_free_blocks == 4


def run_with_tokens(request: Request, token_ids: list[int], max_model_len: int = 64) -> list:
    scheduler = make_scheduler(max_model_len=max_model_len)
    scheduler.add_request(request)
    outputs = []
    for token_id in token_ids:
        if not scheduler.has_unfinished_requests():
            break
        outputs += step(scheduler, token_id)[1]
    assert not scheduler.has_unfinished_requests()
    assert scheduler.block_manager.num_free_blocks == 16
    return outputs


@pytest.mark.parametrize(
    "params, max_model_len, token_ids, num_outputs, finish_reason, stop_reason",
    [
        (dict(eos_token_ids=[2]), 64, [5, 2, 5], 2, "stop", None),
        (dict(eos_token_ids=[2], ignore_eos=True, max_tokens=3), 64, [2] * 4, 3, "length", None),
        (dict(eos_token_ids=[2], min_tokens=3), 64, [2] * 4, 3, "stop", None),
        (dict(stop_token_ids=[9]), 64, [5, 5, 9, 5], 3, "stop", 9),
        (dict(stop_token_ids=[9], min_tokens=2), 64, [9, 9, 5], 2, "stop", 9),
        (dict(stop_token_ids=[9], max_tokens=2), 64, [5, 9, 5], 2, "stop", 9),
        (dict(max_tokens=3), 64, [5] * 5, 3, "length", None),
        (dict(max_tokens=None), 6, [5] * 5, 2, "length", None),
    ],
)
def test_stop_conditions(params, max_model_len, token_ids, num_outputs, finish_reason, stop_reason):
    request = make_request("a", [1, 2, 3, 4], **params)
    outputs = run_with_tokens(request, token_ids, max_model_len)
    assert [o.new_token_ids[0] for o in outputs] == token_ids[:num_outputs]
    assert [o.finished for o in outputs] == [False] * (num_outputs - 1) + [True]
    assert outputs[-1].finish_reason == finish_reason == request.finish_reason
    last = request.output_token_ids[-1]
    assert (last if last in request.sampling_params.stop_token_ids else None) == stop_reason
    expected_status = {
        "stop": RequestStatus.FINISHED_STOPPED,
        "length": RequestStatus.FINISHED_LENGTH,
    }
    assert request.status == expected_status[finish_reason]


def test_abort_waiting_running_and_unknown():
    scheduler = make_scheduler(max_num_seqs=1)
    a = make_request("a", [1, 2, 3, 4, 5])
    b = make_request("b", [6, 7])
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler)
    assert a.block_ids == [0, 1]
    scheduler.abort_requests(["b", "nope"])
    assert b.status == RequestStatus.FINISHED_ABORTED and b.finish_reason == "abort"
    sched_out, _ = step(scheduler)
    assert sched_out.finished_req_ids == ["b"] and [c.req_id for c in sched_out.chunks] == ["a"]
    assert scheduler.get_request("b") is None
    sched_out = scheduler.schedule()
    scheduler.abort_requests(["a", "a", "b"])  # between schedule and update: update skips it
    assert scheduler.update(sched_out, fake_run(sched_out)) == []
    assert a.block_ids == [] and a.num_output_tokens == 2
    assert scheduler.block_manager.num_free_blocks == 16
    assert not scheduler.has_unfinished_requests()
    assert scheduler.schedule().finished_req_ids == ["a"]


def test_logprobs_and_prompt_logprobs_pass_through():
    scheduler = make_scheduler(max_num_batched_tokens=3, enable_prefix_caching=True)
    scheduler.add_request(make_request("a", [1, 2, 3, 4, 5, 6]))
    prompt_lp = [None, {2: Logprob(-0.5, 1)}, {3: Logprob(-0.25, 1)}]
    sched_out = scheduler.schedule()
    runner_out = RunnerOutput([], [], prompt_logprobs={"a": prompt_lp})
    [output] = scheduler.update(sched_out, runner_out)
    assert (output.new_token_ids, output.prompt_logprobs, output.finished) == ([], prompt_lp, False)
    sched_out = scheduler.schedule()
    sample_lp = {7: Logprob(-0.1, 1)}
    runner_out = RunnerOutput(["a"], [7], logprobs=[sample_lp])
    [output] = scheduler.update(sched_out, runner_out)
    assert (output.new_token_ids, output.new_logprobs, output.prompt_logprobs) == (
        [7],
        [sample_lp],
        None,
    )
    # A second request with the same first block reports the tokens served from the cache.
    scheduler.add_request(make_request("b", [1, 2, 3, 4, 9]))
    sched_out = scheduler.schedule()
    assert summary(sched_out)[1] == ("b", 1, 4, [0, 2], True)
    outputs = scheduler.update(sched_out, fake_run(sched_out))
    assert [(o.req_id, o.num_cached_tokens) for o in outputs] == [("a", 0), ("b", 4)]


def test_duplicate_request_id_raises():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [1]))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(make_request("a", [2]))


class KVCheckingRunner:
    """A fake model: stores token ids as 'KV' at their slots, checks every request's whole
    context through its block table, and samples a token from that context."""

    def __init__(self, scheduler: Scheduler, num_blocks: int, token_mode: str) -> None:
        self.scheduler = scheduler
        self.kv: list[int | None] = [None] * (num_blocks * BLOCK_SIZE)
        self.token_mode = token_mode

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        for chunk in sched_out.chunks:
            for j, token_id in enumerate(chunk.token_ids):
                self.kv[slot(chunk.block_ids, chunk.num_computed_tokens + j)] = token_id
        req_ids, sampled = [], []
        for chunk in sched_out.chunks:
            context_len = chunk.num_computed_tokens + len(chunk.token_ids)
            context = [self.kv[slot(chunk.block_ids, pos)] for pos in range(context_len)]
            request = self.scheduler.get_request(chunk.req_id)
            assert context == request.all_token_ids[:context_len], chunk.req_id
            if chunk.sample:
                req_ids.append(chunk.req_id)
                sampled.append(7 if self.token_mode == "seven" else next_token(context))
        return RunnerOutput(req_ids, sampled)


def slot(block_ids: list[int], pos: int) -> int:
    return block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE


def next_token(context: list[int]) -> int:
    return (sum(context) * 31 + len(context)) % 97


def check_step_invariants(scheduler: Scheduler, sched_out: SchedulerOutput) -> None:
    assert sched_out.num_tokens <= scheduler.max_num_batched_tokens
    assert len(sched_out.chunks) <= scheduler.max_num_seqs
    for i, chunk in enumerate(sched_out.chunks):
        request = scheduler.get_request(chunk.req_id)
        is_decode = (
            len(chunk.token_ids) == 1
            and chunk.sample
            and chunk.num_computed_tokens >= request.num_prompt_tokens
        )
        assert is_decode == (i < sched_out.num_decode_chunks)
        end = chunk.num_computed_tokens + len(chunk.token_ids)
        assert len(chunk.block_ids) == -(-end // BLOCK_SIZE)
        assert chunk.sample == (end == request.num_tokens)


@pytest.mark.parametrize("token_mode", ["seven", "context"])
@pytest.mark.parametrize("enable_prefix_caching", [False, True])
def test_random_simulation_leaks_no_block(enable_prefix_caching, token_mode):
    rng = random.Random(1234)
    num_blocks, max_model_len = 20, 40
    scheduler = make_scheduler(num_blocks, 6, 16, max_model_len, enable_prefix_caching)
    runner = KVCheckingRunner(scheduler, num_blocks, token_mode)
    bases = [[rng.randrange(97) for _ in range(16)] for _ in range(3)]
    requests: dict[str, Request] = {}
    for _ in range(10_000):
        if len(requests) < 80 and rng.random() < 0.5:
            prompt = rng.choice(bases)[: rng.randrange(17)]
            prompt += [rng.randrange(97) for _ in range(rng.randint(1, 12))]
            request = make_request(f"r{len(requests)}", prompt, max_tokens=rng.randint(1, 24))
            requests[request.req_id] = request
            scheduler.add_request(request)
        if rng.random() < 0.02:
            scheduler.abort_requests([rng.choice(list(requests))])
        if len(requests) == 80 and not scheduler.has_unfinished_requests():
            break
        sched_out = scheduler.schedule()
        check_step_invariants(scheduler, sched_out)
        scheduler.update(sched_out, runner.execute(sched_out))
    else:
        pytest.fail("the simulation did not finish")
    manager = scheduler.block_manager
    assert manager.num_free_blocks == num_blocks and manager.ref_counts == [0] * num_blocks
    for request in requests.values():
        assert request.is_finished and request.block_ids == []
        if request.status == RequestStatus.FINISHED_ABORTED:
            continue
        params = request.sampling_params
        expected_len = min(params.max_tokens, max_model_len - request.num_prompt_tokens)
        assert request.num_output_tokens == expected_len
        if token_mode == "context":
            expected = list(request.prompt_token_ids)
            for _ in range(expected_len):
                expected.append(next_token(expected))
            assert request.all_token_ids == expected
    assert sum(r.num_preemptions for r in requests.values()) > 0
    num_cached = sum(max(r.num_cached_tokens, 0) for r in requests.values())
    assert (num_cached > 0) == enable_prefix_caching


def test_priority_policy_admits_by_priority_and_preempts_the_lowest():
    manager = BlockManager(4, BLOCK_SIZE, False)
    scheduler = TrackingScheduler(8, 64, 64, manager, None, None, "priority")

    def request(req_id: str, priority: int, arrival: float) -> Request:
        params = SamplingParams(max_tokens=8)
        return Request(req_id, [1] * 4, params, arrival, None, priority)

    low, early_high, high = request("low", 5, 0.0), request("eh", 0, 1.0), request("h", 0, 2.0)
    scheduler.add_request(low)
    step(scheduler)  # low runs alone: block 0
    for r in (high, early_high):  # added out of arrival order
        scheduler.add_request(r)
    assert list(scheduler.waiting) == [early_high, high]  # priority, then arrival
    step(scheduler)  # low takes block 1 for its 5th token; eh and h get blocks 2 and 3
    assert scheduler.running == [early_high, high, low]  # in priority order, not admission
    sched_out, _ = step(scheduler)
    # eh and h need a block each for their 5th token and none is free: low, the lowest
    # priority, is preempted (under fcfs the newest, h, would be), and they get its two.
    assert [c.req_id for c in sched_out.chunks] == ["eh", "h"]
    assert list(scheduler.waiting) == [low] and low.num_preemptions == 1
    urgent = request("urgent", -1, 3.0)
    scheduler.add_request(urgent)
    assert list(scheduler.waiting) == [urgent, low]  # ahead of the preempted one


def test_fcfs_policy_ignores_priority_order_and_refuses_unknown_policies():
    scheduler = make_scheduler()
    late = Request("late", [1], SamplingParams(), 1.0, None, -5)
    scheduler.add_request(make_request("first", [1]))
    scheduler.add_request(late)
    assert [r.req_id for r in scheduler.waiting] == ["first", "late"]
    with pytest.raises(ValueError, match="scheduling policy"):
        Scheduler(8, 64, 64, BlockManager(4, BLOCK_SIZE, False), None, None, "lifo")
