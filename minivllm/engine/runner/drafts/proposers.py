"""The proposer a runner drafts with, from the engine's speculative config: n-gram lookup, or a
draft model (runner/drafts/draft_model.py) in the memory the target's KV cache left."""

from __future__ import annotations

from minivllm.engine.runner.drafts.draft_model import DRAFT_MODEL_MAX_REQUESTS, DraftModelProposer
from minivllm.engine.setup import EngineSetup
from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import Proposer


def build_proposer(setup: EngineSetup) -> Proposer | None:
    """None without speculative decoding. Build it after the target's KV cache: a draft model
    takes what memory that leaves."""
    spec = setup.config.speculative_config
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer.from_config(spec)
    return DraftModelProposer(
        setup.config,
        setup.max_model_len,
        setup.model_config.vocab_size,
        spec.num_speculative_tokens,
        max_requests=spec.disable_by_batch_size or DRAFT_MODEL_MAX_REQUESTS,
    )
