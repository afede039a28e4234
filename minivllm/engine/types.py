"""The plain-data boundary objects of the engine core.

SchedulerOutput goes from the scheduler to the model runner (and, under tensor parallelism,
to every rank), and GrammarOutput after it when some sampled row is constrained; RunnerOutput
comes back (or a PendingRunnerOutput of a launched step, under async scheduling);
EngineRequest goes from a frontend to the core, EngineOutput back. Only ints, floats,
strings, lists, SamplingParams and host numpy arrays (the grammar bitmask, routed experts)
cross these boundaries: no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from minivllm.outputs import LogprobsDict
from minivllm.sampling_params import SamplingParams

# "error": the request failed alone (its structured output grammar did not compile in
# time, or its matcher failed); EngineOutput.error says why.
FinishReason = Literal["stop", "length", "abort", "error"]

# Stands in a chunk for a token that the previous step sampled and the scheduler has not
# seen yet (async scheduling); the runner fills it in on the device.
PLACEHOLDER_TOKEN_ID = -1


@dataclass
class EngineRequest:
    """One request (one of a request's n samples) as a frontend hands it to the core. The
    frontend has validated it (request_checks.check_request); the core trusts it."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    cache_salt: str | None = None  # prefix-cache blocks are shared only within one salt
    priority: int = 0  # under the "priority" scheduling policy, a lower value goes first


@dataclass
class NewRequestData:
    """Sent once, the first step a request is scheduled: what the sampler needs to know."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


@dataclass
class ScheduledChunk:
    """The tokens of one request computed this step.

    token_ids are the tokens at positions [num_computed_tokens, num_computed_tokens +
    len(token_ids)). The runner keeps each request's block table: new_block_ids go at
    index num_prior_blocks of it (0 for a request that is new or back from preemption).
    sample is True when the chunk reaches the request's last known token, so that the
    runner samples the next one (a non-final prefill chunk samples nothing).
    num_draft_tokens: the last num_draft_tokens of token_ids are speculative drafts (after
    the request's last known token): the runner samples at each of the chunk's last
    num_draft_tokens + 1 positions and keeps the drafts its own samples confirm. Under async
    scheduling they may be placeholders (draft slots of a request whose drafts the step in
    flight proposes), and the chunk's positions may assume that every draft in flight is
    accepted: the runner fills and shifts them at launch (engine/runner/drafts/draft_slots.py).
    draft_cap: after the step, the runner's proposer drafts up to draft_cap tokens for the
    request's next step (0: none), returned in RunnerOutput.draft_token_ids.
    """

    req_id: str
    token_ids: list[int]
    num_computed_tokens: int
    new_block_ids: list[int]
    num_prior_blocks: int
    sample: bool
    num_draft_tokens: int = 0
    state_slot: int = -1  # hybrid models: the request's recurrent-state slot
    draft_cap: int = 0
    # Hybrid models, a chunk with drafts: slot i receives the state after its (i + 1)-th token.
    draft_state_slots: list[int] | None = None

    @property
    def context_end(self) -> int:
        """The position after the chunk's last token: how many keys its last row attends to."""
        return self.num_computed_tokens + len(self.token_ids)


@dataclass
class StateCopies:
    """A hybrid model's recurrent-state copies of one step, slot to slot in the runner's state
    pool (pairs at the same index, in order): restores, before the forward: a snapshot into a
    request's slot (a prefix-cache hit resumes from it), a verified draft's state into its
    request's slot, or into a snapshot; and saves, a request's slot into a snapshot after the
    forward (the state where a chunk ends on a snapshot boundary)."""

    restore_src: list[int] = field(default_factory=list)
    restore_dst: list[int] = field(default_factory=list)
    save_src: list[int] = field(default_factory=list)
    save_dst: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    """One step's work. Decode chunks (one token, sample=True, past the prompt) come first."""

    chunks: list[ScheduledChunk]
    num_decode_chunks: int
    new_requests: list[NewRequestData] = field(default_factory=list)
    # Requests the runner can forget (finished, aborted). Preempted ones are not in here.
    finished_req_ids: list[str] = field(default_factory=list)
    # Requests preempted this step: back in the waiting queue, computed again from position 0
    # (the runner frees what it holds of their computed prompt).
    preempted_req_ids: list[str] = field(default_factory=list)
    # Hybrid models with prefix caching: the step's state restores and saves (None: none).
    state_copies: StateCopies | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass
class GrammarOutput:
    """A step's grammar masks (Scheduler.grammar_output), filled on the host while the device
    runs the step's forward; the runner applies them to the logits before it samples.

    rows: the sampled row (a chunk's, or a draft position's) of each bitmask row;
    bitmask: int32 [len(rows), num_words], bit b of word w set iff token 32 * w + b is
    allowed. The scheduler's reused (pinned) buffer: valid until its next fill.
    """

    rows: list[int]
    bitmask: np.ndarray


@dataclass
class RunnerOutput:
    """What the model runner returns: one sampled token per chunk with sample=True, in order.

    A chunk with drafts also gets num_accepted_drafts[i] of them confirmed (its new tokens are
    those drafts, then sampled_token_ids[i]: the target's token after the last accepted one).
    """

    req_ids: list[str]
    sampled_token_ids: list[int]
    # Per sampled request (aligned with req_ids), when the request asked for logprobs.
    logprobs: list[LogprobsDict | None] | None = None
    # Per sampled request: accepted drafts (None: the step had no drafts), and, with
    # logprobs, the accepted drafts' logprobs (logprobs[i] stays sampled_token_ids[i]'s).
    num_accepted_drafts: list[int] | None = None
    # Per sampled request, when the step had drafts: the drafts it verified and those it
    # accepted (a chunk's draft slots may have held placeholders the runner filled, fewer
    # where its proposer found fewer: engine/runner/drafts/draft_slots.py).
    num_draft_tokens: list[int] | None = None
    accepted_draft_ids: list[list[int]] | None = None
    draft_logprobs: list[list[LogprobsDict]] | None = None
    # req_id -> one entry per prompt position computed this step (first prompt token: None).
    prompt_logprobs: dict[str, list[LogprobsDict | None]] = field(default_factory=dict)
    # req_id -> the pooled vector (or [score]) of a pooling request whose prompt ended here.
    pooled: dict[str, list[float]] = field(default_factory=dict)
    # req_id -> the drafts proposed for its next step, after this step's tokens, for each
    # chunk with a draft_cap ([]: the proposer found none).
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # enable_return_routed_experts: the experts of every token row of the step.
    routed_experts: StepRouting | None = None


@dataclass(frozen=True)
class RoutedExpertsSpec:
    """What `enable_return_routed_experts` records per token: the expert ids (by descending
    router weight) of each of the model's num_layers sparse layers, in layer order."""

    num_layers: int  # the sparse (MoE) layers; dense-MLP layers have no row
    top_k: int
    num_experts: int

    @property
    def dtype(self) -> np.dtype:
        """One byte an id where the ids fit (up to 256 experts), else two."""
        return np.dtype(np.uint8 if self.num_experts <= 256 else np.int16)


@dataclass
class StepRouting:
    """A step's routed experts, as the runner read them back: rows[t] for the step's token
    row t ([num_tokens, num_layers, top_k], chunk order), and the KV slot of each row."""

    rows: np.ndarray
    slot_mapping: np.ndarray  # [num_tokens] int64


class PendingRunnerOutput(Protocol):
    """A launched step (an executor's sample): result() waits for its RunnerOutput."""

    def result(self) -> RunnerOutput: ...


@dataclass
class EngineOutput:
    """What the core tells a frontend about one request after a step."""

    req_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    new_logprobs: list[LogprobsDict] | None = None
    prompt_logprobs: list[LogprobsDict | None] | None = None
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None
    error: str | None = None  # why, when finish_reason == "error"
    # This step's speculative drafts of the request and how many were accepted.
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    pooled: list[float] | None = None  # a pooling request's vector or [score], as it ends
    # enable_return_routed_experts: [n, sparse layers, top_k], the routed experts of the
    # request's next n forwarded tokens (positions after those of its earlier outputs).
    routed_experts: np.ndarray | None = None
