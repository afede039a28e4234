"""GET /metrics: vLLM's metric names under the prefix `minivllm:` (prometheus-client).

ServerMetrics is AsyncLLM's observer: it sees each step's outputs once, so the cost is
a few dict operations per request per step. Its registry is its own (no global state).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minivllm.engine.stats import EngineStats
from minivllm.engine.types import EngineOutput
from minivllm.outputs import RequestOutput

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


@dataclass
class _Progress:
    num_tokens: int
    last_token_time: float


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self._labels = labels
        r = self.registry
        names = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"minivllm:{name}", doc, names, registry=r).labels(**labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"minivllm:{name}", doc, names, registry=r).labels(**labels)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(f"minivllm:{name}", doc, names, buckets=buckets, registry=r).labels(
                **labels
            )

        self.running = gauge("num_requests_running", "Requests in the running batch")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV cache usage (1 = full)")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the cache")
        self.preemptions = counter("num_preemptions", "Preemptions")
        self.prompt_tokens = counter("prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = counter("generation_tokens", "Generation tokens processed")
        self._success = Counter(
            "minivllm:request_success",
            "Finished requests, by finish reason",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.ttft = histogram(
            "time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS
        )
        self.itl = histogram("inter_token_latency_seconds", "Inter-token latency", _ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end latency", _LATENCY_BUCKETS)
        self.queue_time = histogram(
            "request_queue_time_seconds", "Time waiting before the first step", _LATENCY_BUCKETS
        )
        self._last = EngineStats()
        self._progress: dict[str, _Progress] = {}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def on_step(
        self, engine_outputs: list[EngineOutput], outputs: list[RequestOutput], stats: EngineStats
    ) -> None:
        """Called by AsyncLLM once per engine step."""
        now = time.time()
        self._observe_stats(stats)
        num_new = sum(len(o.new_token_ids) for o in engine_outputs)
        if num_new:
            self.generation_tokens.inc(num_new)
        for output in outputs:
            self._observe_request(output, now)

    def on_abort(self, request_id: str) -> None:
        """Called by AsyncLLM for an aborted request."""
        self._progress.pop(request_id, None)

    def _observe_stats(self, stats: EngineStats) -> None:
        last, self._last = self._last, stats
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        # The core's counters are totals; prometheus counters take increments.
        for counter, new, old in (
            (self.prefix_queries, stats.prefix_cache_queries, last.prefix_cache_queries),
            (self.prefix_hits, stats.prefix_cache_hits, last.prefix_cache_hits),
            (self.preemptions, stats.num_preemptions, last.num_preemptions),
        ):
            if new > old:
                counter.inc(new - old)

    def _observe_request(self, output: RequestOutput, now: float) -> None:
        num_tokens = sum(len(c.token_ids) for c in output.outputs)
        progress = self._progress.get(output.request_id)
        metrics = output.metrics
        if progress is None and num_tokens:
            progress = self._progress[output.request_id] = _Progress(num_tokens, now)
            self.prompt_tokens.inc(len(output.prompt_token_ids))
            if metrics is not None:
                self.ttft.observe(now - metrics.arrival_time)
        elif progress is not None and num_tokens > progress.num_tokens:
            self.itl.observe(now - progress.last_token_time)
            progress.num_tokens, progress.last_token_time = num_tokens, now
        if not output.finished:
            return
        self._progress.pop(output.request_id, None)
        for choice in output.outputs:
            self._success.labels(
                finished_reason=choice.finish_reason or "abort", **self._labels
            ).inc()
        if metrics is not None:
            self.e2e.observe(now - metrics.arrival_time)
            if metrics.first_scheduled_time is not None:
                self.queue_time.observe(max(metrics.first_scheduled_time - metrics.arrival_time, 0))
