"""Bad input gets an OpenAI-shaped 4xx (never a 5xx); disconnects free KV blocks; /metrics moves."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from tests.entrypoints.conftest import MODEL_NAME

COMPLETION = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _check_error(status: int, body, expected: int) -> None:
    assert status == expected, body
    error = body["error"]
    assert error["code"] == expected and error["message"] and error["type"]
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {**COMPLETION, "temperature": -1}, None),
        ("/v1/completions", {**COMPLETION, "n": "two"}, "n"),
        ("/v1/completions", {**COMPLETION, "max_tokens": 0}, None),
        ("/v1/completions", {**COMPLETION, "n": 10**6}, "n"),
        ("/v1/completions", {**COMPLETION, "logprobs": 10**9}, "logprobs"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {"five": 1.0}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {"999999": 1.0}}, None),
        ("/v1/completions", {**COMPLETION, "logit_bias": {str(i): 1.0 for i in range(2000)}}, None),
        ("/v1/completions", {**COMPLETION, "seed": 2**70}, "seed"),
        ("/v1/completions", {**COMPLETION, "stop": ["x"] * 1000}, "stop"),
        ("/v1/completions", {**COMPLETION, "prompt": [7] * 600}, None),
        ("/v1/completions", {**COMPLETION, "prompt": [10**9]}, None),
        ("/v1/completions", {**COMPLETION, "prompt": []}, "prompt"),
        ("/v1/completions", {"model": MODEL_NAME}, "prompt"),
        ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 50, "logprobs": True}, "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "chat_template": "{{ 1 }}"}, "chat_template"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"content": "no role"}]}, None),
        # A lone surrogate is valid JSON ("\\ud800") but no text the tokenizer can encode.
        ("/v1/completions", {**COMPLETION, "prompt": "a\ud800b"}, "prompt"),
        ("/v1/completions", {**COMPLETION, "prompt": ["ok", "a\ud800b"]}, "prompt"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]},
            "messages",
        ),
        ("/tokenize", {"model": MODEL_NAME, "prompt": "a\ud800b"}, "prompt"),
        # Numbers are numbers: no true as 1.0, no "0.5" (as for n).
        ("/v1/completions", {**COMPLETION, "temperature": True}, "temperature"),
        ("/v1/completions", {**COMPLETION, "top_p": "0.5"}, "top_p"),
        ("/v1/chat/completions", {**CHAT, "presence_penalty": False}, "presence_penalty"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {"5": True}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "best_of": 2}, "best_of"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages",
        ),
        # More than fits in max_model_len (512) is a 400, as in OpenAI and vLLM, not a cap.
        ("/v1/completions", {**COMPLETION, "max_tokens": 10**6}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 600}, "max_tokens"),
        # A field neither OpenAI's API nor vLLM's has (a misspelt constraint, say) is refused,
        # not dropped; so are theirs that this server does not implement, set to do something.
        ("/v1/completions", {**COMPLETION, "frobnicate": [1, {"a": 2}]}, "frobnicate"),
        ("/v1/chat/completions", {**CHAT, "guided_jsonn": {"type": "object"}}, "guided_jsonn"),
        ("/v1/completions", {**COMPLETION, "suffix": "!"}, "suffix"),
        ("/v1/completions", {**COMPLETION, "use_beam_search": True}, "use_beam_search"),
        ("/v1/completions", {**COMPLETION, "add_special_tokens": 1}, "add_special_tokens"),
        ("/v1/chat/completions", {**CHAT, "allowed_token_ids": [10**6]}, None),
        ("/v1/chat/completions", {**CHAT, "allowed_token_ids": [5] * 5000}, "allowed_token_ids"),
        (
            "/v1/chat/completions",
            {**CHAT, "allowed_token_ids": [5], "guided_regex": "a+"},
            None,
        ),
        ("/v1/chat/completions", {**CHAT, "bad_words": ["Hi", " "]}, None),
        ("/v1/completions", {**COMPLETION, "bad_words": ["x"] * 65}, "bad_words"),
        ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 1, "stream": True}, "stream"),
        ("/v1/completions", {**COMPLETION, "prompt_logprobs": 50}, "prompt_logprobs"),
        ("/v1/chat/completions", {**CHAT, "truncate_prompt_tokens": 600}, "truncate_prompt_tokens"),
        ("/v1/chat/completions", {**CHAT, "cache_salt": ""}, "cache_salt"),
        ("/v1/chat/completions", {**CHAT, "priority": True}, "priority"),
        ("/v1/completions", {**COMPLETION, "priority": 3}, None),  # the server runs fcfs
        ("/v1/chat/completions", {**CHAT, "length_penalty": 2}, "length_penalty"),
        ("/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]}, "functions"),
        ("/v1/chat/completions", {**CHAT, "modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_invalid_params_are_400(server, auth, path, body, param) -> None:
    status, response = server.request("POST", path, body, auth)
    _check_error(status, response, 400)
    if param is not None:
        assert response["error"]["param"] is not None and param in response["error"]["param"]


@pytest.mark.parametrize("raw", [b"{bad json", b"[1, 2]", b"\xff\xfe", b"[" * 100000, b""])
def test_malformed_bodies_are_400(server, auth, raw) -> None:
    _check_error(*server.request("POST", "/v1/completions", raw, auth), 400)


def test_oversized_body_is_413(server, auth) -> None:
    body = json.dumps({**COMPLETION, "prompt": "x" * (9 << 20)})
    _check_error(*server.request("POST", "/v1/completions", body, auth), 413)


def test_unknown_model_is_404(server, auth) -> None:
    _check_error(
        *server.request("POST", "/v1/completions", {**COMPLETION, "model": "x"}, auth), 404
    )
    # The message quotes the name; a lone surrogate in it is escaped, not a 500.
    status, body = server.request(
        "POST", "/v1/completions", {**COMPLETION, "model": "\ud800"}, auth
    )
    _check_error(status, body, 404)
    assert "\ud800" in body["error"]["message"]
    # The second served name works too; a missing model means the first.
    for model in ("other-name", None):
        status, _ = server.request("POST", "/v1/completions", {**COMPLETION, "model": model}, auth)
        assert status == 200


@pytest.mark.parametrize(
    "path, body",
    [
        (
            "/v1/completions",
            {**COMPLETION, "use_beam_search": False, "length_penalty": 1, "priority": 0,
             "add_special_tokens": True, "guided_decoding_backend": "xgrammar", "user": "u"},
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "bad_words": [], "echo": False, "modalities": ["text"], "store": False,
             "metadata": {"app": "test"}, "service_tier": "auto", "reasoning_effort": "low",
             "documents": [{"title": "a", "text": "b"}], "spaces_between_special_tokens": True},
        ),
    ],
)  # fmt: skip
def test_fields_at_values_that_change_nothing_are_accepted(server, auth, path, body) -> None:
    status, response = server.request("POST", path, body, auth)
    assert status == 200, response


def _wait_for(server, predicate, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while True:
        values = server.metrics()
        if predicate(values) or time.time() > deadline:
            return values
        time.sleep(0.05)


def _open_request(server, auth, body: dict) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), auth)
    return conn


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_aborts_and_frees_blocks(server, auth, stream) -> None:
    body = {**COMPLETION, "max_tokens": 400, "ignore_eos": True, "stream": stream}
    running = "minivllm:num_requests_running"
    usage = "minivllm:kv_cache_usage_perc"
    assert _wait_for(server, lambda m: m[running] == 0)[running] == 0
    conn = _open_request(server, auth, body)
    if stream:
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data: ")  # generation has started
    values = _wait_for(server, lambda m: m[running] == 1 and m[usage] > 0)
    assert values[running] == 1 and values[usage] > 0
    conn.sock.close()  # the client goes away mid-request
    conn.close()
    values = _wait_for(server, lambda m: m[running] == 0 and m[usage] == 0)
    assert values[running] == 0 and values[usage] == 0.0  # every KV block is free again


def test_metrics_move(server, client) -> None:
    before = server.metrics()
    client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=5, temperature=0)
    after = server.metrics()
    for name in (
        "minivllm:generation_tokens_total",
        "minivllm:prompt_tokens_total",
        "minivllm:prefix_cache_queries_total",
        "minivllm:time_to_first_token_seconds_count",
        "minivllm:e2e_request_latency_seconds_count",
        "minivllm:request_queue_time_seconds_count",
        "minivllm:inter_token_latency_seconds_count",
    ):
        assert after[name] > before.get(name, 0), name
    assert (
        after["minivllm:generation_tokens_total"] - before["minivllm:generation_tokens_total"] >= 5
    )
    ok = [k for k in after if k.startswith("minivllm:request_success_total[")]
    assert sum(after[k] for k in ok) > sum(before.get(k, 0) for k in ok)
