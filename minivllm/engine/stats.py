"""EngineStats: a cheap snapshot of the core's load, for /metrics and logging."""

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
