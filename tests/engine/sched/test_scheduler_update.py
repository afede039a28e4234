"""Scheduler.update with steps scheduled ahead (async): tokens matched to chunks by position,
and a request preempted while its token is in flight that this token finishes."""

from __future__ import annotations

from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.types import RunnerOutput
from minivllm.sampling_params import SamplingParams


def make_request(req_id: str, prompt_token_ids: list[int], max_tokens: int = 16) -> Request:
    return Request(req_id, prompt_token_ids, SamplingParams(max_tokens=max_tokens), 0.0)


def test_sampled_tokens_follow_chunk_order_past_an_aborted_request():
    scheduler = Scheduler(8, 64, 64, BlockManager(16, 4, False))
    for req_id in "abc":
        scheduler.add_request(make_request(req_id, [1, 2, 3]))
    sched_out = scheduler.schedule()
    scheduler.abort_requests(["b"])  # between schedule and update: its token is dropped
    outputs = scheduler.update(sched_out, RunnerOutput(["a", "b", "c"], [10, 11, 12]))
    assert [(o.req_id, o.new_token_ids) for o in outputs] == [("a", [10]), ("c", [12])]
    assert scheduler.get_request("c").output_token_ids == [12]


def test_request_preempted_in_flight_and_finished_by_that_token_leaves_waiting():
    # 3 blocks of 2: x holds 2 and a 1 after step 1, so x's next token preempts a, whose
    # step-1 token (its last: max_tokens=1) is still in flight.
    scheduler = Scheduler(2, 64, 64, BlockManager(3, 2, False))
    x, a = make_request("x", [1, 2, 3, 4]), make_request("a", [5, 6], max_tokens=1)
    scheduler.add_request(x)
    scheduler.add_request(a)
    step1 = scheduler.schedule()
    step2 = scheduler.schedule()  # scheduled ahead of step 1's update
    assert [c.req_id for c in step2.chunks] == ["x"]
    assert a.status == RequestStatus.WAITING and a.num_pending_tokens == 1
    assert [c.req_id for c in step1.chunks] == ["a", "x"]  # prefills by context end
    outputs = scheduler.update(step1, RunnerOutput(["a", "x"], [8, 7]))
    assert [(o.req_id, o.finished, o.finish_reason) for o in outputs] == [
        ("a", True, "length"),
        ("x", False, None),
    ]
    assert a not in scheduler.waiting and a not in scheduler.running
    assert a.status == RequestStatus.FINISHED_LENGTH
    scheduler.update(step2, RunnerOutput(["x"], [9]))
    assert x.output_token_ids == [7, 9] and scheduler.running == [x]
    assert scheduler.schedule().finished_req_ids == ["a"]
