"""Request: the scheduler's record of one generation (tokens, progress, blocks, status), and the
EngineOutput it gives a step."""

from __future__ import annotations

import enum

from minivllm.engine.types import EngineOutput, FinishReason, LogprobsDict
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.request_state import StructuredOutputRequest


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()


class Request:
    """One prompt and what has been generated for it so far.

    Tokens at positions [0, num_computed_tokens) have their KV in the blocks of block_ids;
    the rest of all_token_ids still has to be computed (a prompt chunk, the last sampled
    token, or everything again after a preemption).
    """

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {req_id!r} has an empty prompt: give at least one token")
        self.req_id = req_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        # Prefix-cache blocks are shared only between requests of the same salt (vLLM's
        # cache_salt: tenants that must not learn each other's prompts from cache hits).
        self.cache_salt = cache_salt
        # Under the "priority" scheduling policy, a lower value goes first (vLLM's).
        self.priority = priority
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens sampled by a step whose result update() has not applied yet (0 or 1): with
        # async scheduling the next step is scheduled before the last one's tokens are known.
        self.num_pending_tokens = 0
        # Draft slots of scheduled steps that update() has not applied: the scheduler counts
        # them computed (as if accepted) until it learns how many were.
        self.num_pending_drafts = 0
        self.status = RequestStatus.WAITING
        # Written by the scheduler only (what BlockManager.allocate_slots returns).
        self.block_ids: list[int] = []
        # Hybrid models: the recurrent-state slot the KV coordinator gave it; -1: none.
        self.state_slot = -1
        # Hybrid models: the slots of the states after each draft of its chunk in flight.
        self.draft_state_slots: list[int] = []
        # Chained hashes of the full blocks of all_token_ids, extended by the BlockManager.
        self.block_hashes: list[int] = []
        # Prompt tokens served from the prefix cache at first admission; -1 before.
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.finish_reason: FinishReason | None = None
        self.first_scheduled_time: float | None = None
        # The grammar state of a constrained request (structured outputs), set by the
        # scheduler at add_request; its matcher has accepted exactly output_token_ids.
        self.structured_output: StructuredOutputRequest | None = None
        self.error: str | None = None  # why, when finish_reason == "error"

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        # Every finished status comes with a finish_reason; this is the cheap test of it.
        return self.finish_reason is not None

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id!r}, status={self.status.name}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens}, block_ids={self.block_ids})"
        )


def engine_output(
    request: Request,
    new_token_ids: list[int],
    new_logprobs: list[LogprobsDict] | None,
    prompt_logprobs: list[LogprobsDict | None] | None,
) -> EngineOutput:
    """request's output of a step: its new tokens (and logprobs), and where it stands."""
    # Positional: at a thousand outputs a step, keyword arguments cost twice the time.
    return EngineOutput(
        request.req_id,
        new_token_ids,
        request.finish_reason is not None,
        request.finish_reason,
        new_logprobs,
        prompt_logprobs,
        request.num_cached_tokens,  # set at first admission, before any chunk
        request.first_scheduled_time,
        request.error,
    )


def needs_host_tokens(request: Request) -> bool:
    """Bad words and a thinking budget read sampled tokens on the host each step. (Penalties
    count them on the device, min_tokens counts steps, logprobs are read after the step; a
    grammar reads them only for the next step's mask, which is filled once the step in flight
    has been applied: engine/sched/async_scheduler.py.)"""
    p = request.sampling_params
    return bool(p.bad_words or p.thinking_token_budget is not None)


def draft_room(
    request: Request, limit: int, max_model_len: int, after_pending: bool = False
) -> int:
    """How many drafts (speculative or a grammar's forced tokens) request may take this step,
    at most limit: 0 unless its next step is a plain decode after its first output token
    with every token known, or, with after_pending, all but the one in flight (async
    scheduling: the drafts follow a placeholder); the step's accepted drafts and one token
    must fit max_tokens and max_model_len."""
    num_pending = request.num_pending_tokens
    num_tokens = request.num_tokens + num_pending
    num_output_tokens = request.num_output_tokens + num_pending
    if (
        (num_pending and not after_pending)
        or request.num_computed_tokens != num_tokens - 1
        or num_output_tokens < 1
    ):
        return 0
    return token_room(request.sampling_params, num_tokens, num_output_tokens, limit, max_model_len)


def token_room(
    params: SamplingParams, num_tokens: int, num_output_tokens: int, limit: int, max_model_len: int
) -> int:
    """How many drafts fit after num_tokens tokens (num_output_tokens of them output) with one
    token of the target's after them: at most limit, within max_model_len and max_tokens."""
    room = min(limit, max_model_len - num_tokens - 1)
    if params.max_tokens is not None:
        room = min(room, params.max_tokens - num_output_tokens - 1)
    return max(room, 0)
