"""What the engine core reports about itself: CoreInfo once at start, EngineStats per step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Gauges (now) and monotonic counters (since start) of one EngineCore."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks held by requests, in [0, 1]
    num_free_blocks: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up at admission
    prefix_cache_hits: int = 0  # of those, tokens found in the cache
    # Speculative decoding (spec_decode/metrics.py): requests' drafting steps, their draft
    # tokens, the accepted ones, and per draft position how many were accepted.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class CoreInfo:
    """What a frontend needs to validate requests without the engine at hand."""

    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    pid: int
