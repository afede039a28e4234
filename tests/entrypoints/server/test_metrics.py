"""/metrics publishes our `minivllm:` names and vLLM's `vllm:` names (what routers, dashboards
and autoscalers read), with vLLM's label `model_name`; both move with the requests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.conftest import MODEL_NAME

PREFIXES = ("minivllm:", "vllm:")
GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
COUNTERS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "num_preemptions_total",
    "request_success_total",
)
# One observation per request.
REQUEST_HISTOGRAMS = (
    "time_to_first_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_inference_time_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
)
NUM_REQUESTS, MAX_TOKENS = 4, 5


def _scrape(server) -> list:
    status, text = server.request("GET", "/metrics")
    assert status == 200
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _value(samples: list, name: str, **labels: str) -> float:
    """The sum of name's samples whose labels include `labels` (le buckets excluded)."""
    return sum(
        s.value
        for s in samples
        if s.name == name
        and "le" not in s.labels
        and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_vllm_names_are_published_with_model_name(server) -> None:
    samples = _scrape(server)
    names = {s.name for s in samples}
    for prefix in PREFIXES:
        for name in (
            *GAUGES,
            *COUNTERS,
            "inter_token_latency_seconds_count",
            *(f"{h}_count" for h in REQUEST_HISTOGRAMS),
        ):
            if name != "request_success_total":  # appears with the first finished request
                assert prefix + name in names, prefix + name
    # vLLM's older names of two series.
    assert "vllm:gpu_cache_usage_perc" in names
    assert "vllm:time_per_output_token_seconds_bucket" in names
    for s in samples:
        if s.name.startswith(PREFIXES):
            assert s.labels.get("model_name") == MODEL_NAME, s


def test_both_names_move_with_requests(server, client) -> None:
    before = _scrape(server)
    prompt_tokens = 0
    for i in range(NUM_REQUESTS - 1):
        response = client.completions.create(
            model=MODEL_NAME,
            prompt=f"Metrics test {i}",
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        prompt_tokens += response.usage.prompt_tokens
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Metrics test chat"}],
        max_tokens=MAX_TOKENS,
        extra_body={"ignore_eos": True},
        stream=True,
        stream_options={"include_usage": True},
    )
    prompt_tokens += [c for c in stream][-1].usage.prompt_tokens
    after = _scrape(server)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    for prefix in PREFIXES:
        assert delta(prefix + "prompt_tokens_total") == prompt_tokens
        assert delta(prefix + "generation_tokens_total") == NUM_REQUESTS * MAX_TOKENS
        queries = delta(prefix + "prefix_cache_queries_total")
        assert queries > 0 and 0 <= delta(prefix + "prefix_cache_hits_total") <= queries
        assert delta(prefix + "request_success_total", finished_reason="length") == NUM_REQUESTS
        for histogram in REQUEST_HISTOGRAMS:
            assert delta(f"{prefix}{histogram}_count") == NUM_REQUESTS, histogram
            assert delta(f"{prefix}{histogram}_sum") >= 0, histogram
        gaps = delta(prefix + "inter_token_latency_seconds_count")
        assert 0 < gaps <= NUM_REQUESTS * (MAX_TOKENS - 1)
        assert delta(prefix + "request_generation_tokens_sum") == NUM_REQUESTS * MAX_TOKENS
        # Idle again: nothing running or waiting, every block free or cached.
        assert _value(after, prefix + "num_requests_running") == 0
        assert _value(after, prefix + "num_requests_waiting") == 0
        assert 0 <= _value(after, prefix + "kv_cache_usage_perc") <= 1
    # The same series under both names, and under vLLM's older names.
    by_key = {(s.name, frozenset(s.labels.items())): s.value for s in after}
    for (name, labels), value in by_key.items():
        if name.startswith("minivllm:") and not name.endswith("_created"):
            twin = name.replace("minivllm:", "vllm:", 1)
            assert by_key[(twin, labels)] == value, twin
    assert _value(after, "vllm:gpu_cache_usage_perc") == _value(after, "vllm:kv_cache_usage_perc")
    assert delta("vllm:time_per_output_token_seconds_count") == delta(
        "vllm:inter_token_latency_seconds_count"
    )


def test_speculative_decoding_counters() -> None:
    """The engine's speculation counters reach /metrics under vLLM's names (what `vllm bench
    serve` reads for the acceptance rate), as increments, per draft position too."""
    from minivllm.engine.stats import EngineStats
    from minivllm.entrypoints.server.metrics import ServerMetrics

    metrics = ServerMetrics(MODEL_NAME)
    for drafts, tokens, accepted, per_pos in ((2, 8, 5, [2, 2, 1, 0]), (3, 12, 7, [3, 2, 1, 1])):
        stats = EngineStats(
            spec_num_drafts=drafts,
            spec_num_draft_tokens=tokens,
            spec_num_accepted_tokens=accepted,
            spec_accepted_per_pos=per_pos,
        )
        metrics.on_step([], [], stats)
    text = metrics.render().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    for prefix in PREFIXES:
        assert _value(samples, prefix + "spec_decode_num_drafts_total") == 3
        assert _value(samples, prefix + "spec_decode_num_draft_tokens_total") == 12
        assert _value(samples, prefix + "spec_decode_num_accepted_tokens_total") == 7
        per_pos = prefix + "spec_decode_num_accepted_tokens_per_pos_total"
        assert [_value(samples, per_pos, position=str(j)) for j in range(4)] == [3, 2, 1, 1]
