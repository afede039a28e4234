"""What the engine core reports about itself: CoreInfo once at start, EngineStats per step."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class CoreInfo:
    """What a frontend needs to validate requests without the engine at hand."""

    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    pid: int
