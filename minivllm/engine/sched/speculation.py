"""Speculation in the scheduler, the policy only: which requests the runner drafts for after a
step (ScheduledChunk.draft_cap), which drafts a request uses the step after (they come back as
data, RunnerOutput.draft_token_ids), and the acceptance counters. The proposers run in the
runner (engine/runner/drafts/drafter.py), after sampling, where the tokens are.

A request drafts when its next step would be a plain decode with every token known. Each draft
position is sampled as if the drafts before it were output: penalties count them and min_tokens
counts them (runner/drafts/draft_step.py), and a constrained request's draft positions get a grammar
mask each; where its grammar forces the next tokens, those are its drafts instead (jump-forward,
engine/sched/grammar.py). Drafts never run past max_tokens or max_model_len.

A request whose drafting fails (no match, or none of its drafts accepted) backs off: it tries
again after 1, 2, 4, ... up to MAX_BACKOFF_TOKENS more tokens, and succeeding resets it.

Async scheduling stays on while requests draft: a request whose step in flight asked for drafts gets
*draft slots* in the next step, placeholders the runner fills with the proposals once it has read
that step (engine/runner/drafts/draft_slots.py), at positions that assume the drafts in flight are
all accepted; update() corrects them. A constrained request's draft positions need their masks
before the step is launched, so its drafts must be known: a step that asked drafts for one is
applied before the next is scheduled (Scheduler.can_schedule_ahead).
"""

from __future__ import annotations

from minivllm.engine.sched.request import Request, draft_room, token_room
from minivllm.engine.types import PLACEHOLDER_TOKEN_ID
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.metrics import SpecDecodingStats

MAX_BACKOFF_TOKENS = 16


class Speculator:
    """Who drafts, how many drafts each takes, and what was accepted."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.num_speculative_tokens = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size
        self.max_model_len = max_model_len
        self.stats = SpecDecodingStats(config.num_speculative_tokens)
        # Under synthetic acceptance (benchmarks) a rejection is a coin's, not the text's: no
        # back-off, so that every step drafts, as in vLLM.
        self._backs_off = config.acceptance != "synthetic"
        # req_id -> (output length at which it may draft again, consecutive failures).
        self._backoff: dict[str, tuple[int, int]] = {}
        # req_id -> (its history's length when proposed, the drafts that follow it).
        self._drafts: dict[str, tuple[int, list[int]]] = {}
        # Requests whose drafts a launched step asked for -> the last cap asked, until the
        # update() of the last such step brings them (two steps may have asked: the one in
        # flight and the one just scheduled); those whose drafts must be known before the
        # next step is scheduled.
        self.asked: dict[str, int] = {}
        self.asked_in_sync: set[str] = set()
        self._num_asks: dict[str, int] = {}  # req_id -> the launched steps that asked

    def is_active(self, num_requests: int) -> bool:
        """Whether a step with num_requests running or waiting speculates (vLLM's
        disable_by_batch_size: off while more are)."""
        limit = self.disable_by_batch_size
        return limit is None or num_requests <= limit

    def is_due(self, request: Request, num_more: int = 0) -> bool:
        """Whether request is not backing off, counting its token in flight and num_more."""
        due = self._backoff.get(request.req_id)
        num_output = request.num_output_tokens + request.num_pending_tokens + num_more
        return due is None or num_output >= due[0]

    def ask(self, request: Request) -> int:
        """The draft_cap of request's chunk being scheduled (it samples one token; called
        before that token counts as pending): how many drafts the runner proposes after it,
        at most k, fewer where max_tokens or max_model_len leaves less room, 0 while it backs
        off. A request asked stays in `asked` until receive()."""
        cap = self._draft_cap(request)
        if cap:
            self.asked[request.req_id] = cap
            self._num_asks[request.req_id] = self._num_asks.get(request.req_id, 0) + 1
            if request.structured_output is not None:  # its draft positions need masks
                self.asked_in_sync.add(request.req_id)
        return cap

    def _draft_cap(self, request: Request) -> int:
        if not self.is_due(request, 1):
            return 0
        num_new = request.num_pending_tokens + 1  # the chunk's token counts as output
        return token_room(
            request.sampling_params,
            request.num_tokens + num_new,
            request.num_output_tokens + num_new,
            self.num_speculative_tokens,
            self.max_model_len,
        )

    def receive(self, request: Request, drafts: list[int]) -> None:
        """The drafts the runner proposed for request after a step whose tokens update() has
        just appended; none proposed is a failure (back-off)."""
        num_asks = self._num_asks.get(request.req_id, 0) - 1
        if num_asks > 0:
            self._num_asks[request.req_id] = num_asks  # a later step asked again
        else:
            self._unask(request.req_id)
        if drafts:
            self._drafts[request.req_id] = (request.num_tokens, drafts)
        else:
            self._drafts.pop(request.req_id, None)
            self._failed(request)

    def take_drafts(self, request: Request) -> list[int]:
        """The drafts request uses this step: those proposed after its last token, capped by
        max_tokens and max_model_len; [] unless its next step is a plain decode with every
        token known."""
        entry = self._drafts.pop(request.req_id, None)
        if entry is None or entry[0] != request.num_tokens:
            return []
        room = draft_room(request, self.num_speculative_tokens, self.max_model_len)
        return entry[1][:room]

    def take_slots(self, request: Request) -> list[int]:
        """Draft slots (placeholders) for request, whose step in flight asked for its drafts:
        as many as it asked, fewer where max_tokens or max_model_len leaves less room after
        the tokens in flight (its drafts counted as accepted); [] for a request whose drafts
        must be known first."""
        cap = self.asked.get(request.req_id, 0)
        # Slots follow the token in flight: the runner fills them once it has read that step.
        if not cap or not request.num_pending_tokens or request.req_id in self.asked_in_sync:
            return []
        num_new = request.num_pending_tokens + request.num_pending_drafts
        room = token_room(
            request.sampling_params,
            request.num_tokens + num_new,
            request.num_output_tokens + num_new,
            cap,
            self.max_model_len,
        )
        return [PLACEHOLDER_TOKEN_ID] * room

    def observe(self, request: Request, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's drafts of a step, before its new tokens are appended."""
        self.stats.observe_draft(num_draft_tokens, num_accepted)
        if num_accepted:
            self._backoff.pop(request.req_id, None)
        elif self._backs_off:
            self._failed(request)

    def forget(self, req_id: str) -> None:
        self._backoff.pop(req_id, None)
        self._drafts.pop(req_id, None)
        self._unask(req_id)

    def _unask(self, req_id: str) -> None:
        self.asked.pop(req_id, None)
        self.asked_in_sync.discard(req_id)
        self._num_asks.pop(req_id, None)

    def _failed(self, request: Request) -> None:
        misses = self._backoff.get(request.req_id, (0, 0))[1] + 1
        wait = min(1 << (misses - 1), MAX_BACKOFF_TOKENS)
        self._backoff[request.req_id] = (request.num_output_tokens + 1 + wait, misses)
