"""Speculation in the scheduler: which running requests get draft tokens this step, the
drafts themselves (from the proposer), and the acceptance counters.

A request drafts only when its next step would be a plain decode whose sampling depends on
nothing the drafts change: no grammar (one mask per position is not built), no penalties (they
would have to count the drafts before each position), and min_tokens reached (no EOS
suppression that varies by position). Its drafts never run past max_tokens or max_model_len.
"""

from __future__ import annotations

from minivllm.engine.sched.request import Request
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.metrics import SpecDecodingStats
from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import ProposeInput, Proposer


def check_speculative_config(config: SpeculativeConfig) -> None:
    """ValueError for options this engine does not run."""
    if config.method != "ngram":
        raise ValueError(
            f"speculative method {config.method!r} is not supported by this engine yet; use 'ngram'"
        )


class Speculator:
    """Drafts tokens for the scheduler's decode-ready requests; counts what is accepted."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        check_speculative_config(config)
        self.proposer: Proposer = NgramProposer.from_config(config)
        self.num_speculative_tokens = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size
        self.max_model_len = max_model_len
        self.stats = SpecDecodingStats(config.num_speculative_tokens)

    def is_active(self, num_running: int) -> bool:
        """Whether a step with num_running requests speculates (vLLM's disable_by_batch_size:
        off while more are running)."""
        limit = self.disable_by_batch_size
        return limit is None or num_running <= limit

    def propose(self, requests: list[Request]) -> dict[str, list[int]]:
        """req_id -> its drafts (at least one), for those of `requests` that may draft."""
        rows = [(r, self._max_drafts(r)) for r in requests]
        rows = [(r, cap) for r, cap in rows if cap > 0]
        if not rows:
            return {}
        batch = ProposeInput.from_lists(
            [r.all_token_ids for r, _ in rows], [cap for _, cap in rows]
        )
        drafts = self.proposer.propose(batch).to_lists()
        return {r.req_id: d for (r, _), d in zip(rows, drafts, strict=True) if d}

    def _max_drafts(self, request: Request) -> int:
        """How many drafts request may take this step (0: it decodes one token as usual)."""
        params = request.sampling_params
        if (
            request.num_pending_tokens
            or request.num_computed_tokens != request.num_tokens - 1
            or request.num_output_tokens < max(params.min_tokens, 1)
            or request.structured_output is not None
            or params.presence_penalty
            or params.frequency_penalty
            or params.repetition_penalty != 1.0
        ):
            return 0
        # The step adds the accepted drafts and one token: all must fit the request's limits.
        cap = min(self.num_speculative_tokens, self.max_model_len - request.num_tokens - 1)
        if params.max_tokens is not None:
            cap = min(cap, params.max_tokens - request.num_output_tokens - 1)
        return max(cap, 0)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.stats.observe_draft(num_draft_tokens, num_accepted)
