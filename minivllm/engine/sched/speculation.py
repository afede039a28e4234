"""Speculation in the scheduler: which running requests get draft tokens this step, the
drafts themselves (from the proposer), and the acceptance counters.

A request drafts when its next step would be a plain decode. Each draft position is sampled
as if the drafts before it were output: penalties count them and min_tokens counts them
(runner/draft_step.py), and a constrained request's draft positions get a grammar mask each;
where its grammar forces the next tokens, those are its drafts instead (jump-forward,
engine/sched/grammar.py). Drafts never run past max_tokens or max_model_len.

A request whose drafting fails (no match, or none of its drafts accepted) backs off: it tries
again after 1, 2, 4, ... up to MAX_BACKOFF_TOKENS more tokens, and succeeding resets it. A step
in which no request is due to draft needs no host tokens, so it runs under async scheduling:
text that does not repeat itself decodes at the speed it has without speculation.
"""

from __future__ import annotations

from minivllm.engine.sched.request import Request, draft_room
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.metrics import SpecDecodingStats
from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import ProposeInput, Proposer

MAX_BACKOFF_TOKENS = 16


def check_speculative_config(config: SpeculativeConfig, tensor_parallel_size: int) -> None:
    """ValueError for options this engine does not run."""
    if config.method == "draft_model" and tensor_parallel_size > 1:
        raise ValueError(
            "speculative method 'draft_model' runs with tensor_parallel_size=1 only; use "
            "'ngram' under tensor parallelism"
        )


class Speculator:
    """Drafts tokens for the scheduler's decode-ready requests; counts what is accepted."""

    def __init__(
        self, config: SpeculativeConfig, max_model_len: int, proposer: Proposer | None = None
    ) -> None:
        """proposer: the draft model's (engine/draft_model.py), built by the engine; None for
        ngram, which is built here."""
        if proposer is None and config.method != "ngram":
            raise ValueError(f"speculative method {config.method!r} needs its proposer")
        self.proposer: Proposer = proposer or NgramProposer.from_config(config)
        self.num_speculative_tokens = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size
        self.max_model_len = max_model_len
        self.stats = SpecDecodingStats(config.num_speculative_tokens)
        # Under synthetic acceptance (benchmarks) a rejection is a coin's, not the text's: no
        # back-off, so that every step drafts, as in vLLM.
        self._backs_off = config.acceptance != "synthetic"
        # req_id -> (output length at which it may draft again, consecutive failures).
        self._backoff: dict[str, tuple[int, int]] = {}

    def is_active(self, num_running: int) -> bool:
        """Whether a step with num_running requests speculates (vLLM's disable_by_batch_size:
        off while more are running)."""
        limit = self.disable_by_batch_size
        return limit is None or num_running <= limit

    def wants_last_tokens(self, requests: list[Request]) -> bool:
        """Whether some request is due to draft once the step in flight is applied (then the
        next step must start from every token, not run ahead)."""
        backoff = self._backoff
        for r in requests:
            due = backoff.get(r.req_id)
            if due is None or r.num_output_tokens + r.num_pending_tokens >= due[0]:
                return True
        return False

    def propose(self, requests: list[Request]) -> dict[str, list[int]]:
        """req_id -> its drafts (at least one), for those of `requests` that may draft."""
        rows = [(r, self._max_drafts(r)) for r in requests]
        rows = [(r, cap) for r, cap in rows if cap > 0]
        if not rows:
            return {}
        batch = ProposeInput.from_lists(
            [r.all_token_ids for r, _ in rows],
            [cap for _, cap in rows],
            [r.req_id for r, _ in rows],
        )
        drafts = self.proposer.propose(batch).to_lists()
        for (r, _), d in zip(rows, drafts, strict=True):
            if not d:
                self._failed(r)
        return {r.req_id: d for (r, _), d in zip(rows, drafts, strict=True) if d}

    def observe(self, request: Request, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's drafts of a step, before its new tokens are appended."""
        self.stats.observe_draft(num_draft_tokens, num_accepted)
        if num_accepted:
            self._backoff.pop(request.req_id, None)
        elif self._backs_off:
            self._failed(request)

    def forget(self, req_id: str) -> None:
        self._backoff.pop(req_id, None)
        self.proposer.remove_requests([req_id])

    def _failed(self, request: Request) -> None:
        misses = self._backoff.get(request.req_id, (0, 0))[1] + 1
        wait = min(1 << (misses - 1), MAX_BACKOFF_TOKENS)
        self._backoff[request.req_id] = (request.num_output_tokens + 1 + wait, misses)

    def _max_drafts(self, request: Request) -> int:
        """How many drafts request may take this step (0: it decodes one token as usual)."""
        due = self._backoff.get(request.req_id)
        if due is not None and request.num_output_tokens < due[0]:
            return 0
        return draft_room(request, self.num_speculative_tokens, self.max_model_len)
