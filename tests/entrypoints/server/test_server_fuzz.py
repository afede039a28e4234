"""Hostile JSON bodies (hypothesis): the server never answers 5xx and stays healthy."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.entrypoints.conftest import MODEL_NAME

# Any code point, and often a lone surrogate: valid in JSON ("\\ud800"), but no text a
# tokenizer takes (hypothesis's own text rarely draws one).
_CHARS = st.characters(exclude_categories=())
_SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())


def _text(max_size: int) -> st.SearchStrategy[str]:
    half = max_size // 2
    around = st.text(alphabet=_CHARS, max_size=half)
    with_surrogate = st.builds(lambda a, c, b: a + c + b, around, _SURROGATE, around)
    return st.one_of(st.text(alphabet=_CHARS, max_size=max_size), with_surrogate)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _text(20),
)
_JUNK = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Valid generations stay short: max_tokens is small, or junk (then it fails validation).
_MAX_TOKENS = st.one_of(st.integers(min_value=1, max_value=3), _JUNK)
_FIELDS = {
    "model": st.one_of(st.just(MODEL_NAME), _JUNK),
    "n": st.one_of(st.integers(min_value=-3, max_value=300), _JUNK),
    "temperature": st.one_of(st.floats(min_value=-1, max_value=3), _JUNK),
    "top_p": _JUNK,
    "top_k": st.one_of(st.integers(min_value=-2, max_value=600), _JUNK),
    "stop": st.one_of(st.lists(st.text(max_size=5), max_size=5), _JUNK),
    "seed": _JUNK,
    "logprobs": st.one_of(st.integers(min_value=-2, max_value=10**6), _JUNK),
    "stream": st.booleans(),
    "stream_options": _JUNK,
    "presence_penalty": _JUNK,
    "repetition_penalty": _JUNK,
    "min_tokens": _JUNK,
    "stop_token_ids": _JUNK,
    "logit_bias": _JUNK,
    "echo": _JUNK,
    "ignore_eos": st.booleans(),
}
_PROMPT = st.one_of(
    _text(40),
    st.lists(st.integers(min_value=-5, max_value=600), max_size=40),
    st.lists(_text(10), max_size=3),
    _JUNK,
)
_MESSAGES = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant"]), "content": _SCALARS}
        ),
        max_size=3,
    ),
    _JUNK,
)


def _body(kind: str):
    required = {"prompt": _PROMPT} if kind == "completions" else {"messages": _MESSAGES}
    required["max_tokens"] = _MAX_TOKENS
    return st.fixed_dictionaries(required, optional={**_FIELDS, "zz_unknown": _JUNK})


def _check(server, auth, path: str, body: dict) -> None:
    raw = json.dumps(body)  # NaN / Infinity go through as Python's json writes them
    status, response = server.request("POST", path, raw, auth)
    assert status < 500, (status, response, raw)
    if status >= 400:
        assert set(response["error"]) == {"message", "type", "param", "code"}


_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@_SETTINGS
@given(body=_body("completions"))
def test_fuzz_completions(server, auth, body) -> None:
    _check(server, auth, "/v1/completions", body)


@_SETTINGS
@given(body=_body("chat"))
def test_fuzz_chat(server, auth, body) -> None:
    _check(server, auth, "/v1/chat/completions", body)


# Otherwise valid requests whose text is hostile (any code point, lone surrogates included):
# junk elsewhere in a body is rejected before its text reaches the tokenizer.
_TEXT_SETTINGS = settings(_SETTINGS, max_examples=25)


@_TEXT_SETTINGS
@given(prompt=st.one_of(_text(40), st.lists(_text(10), min_size=1, max_size=3)))
def test_fuzz_prompt_text(server, auth, prompt) -> None:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}
    _check(server, auth, "/v1/completions", body)
    _check(server, auth, "/tokenize", {"model": MODEL_NAME, "prompt": prompt})


@_TEXT_SETTINGS
@given(content=_text(40))
def test_fuzz_message_text(server, auth, content) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
    }
    _check(server, auth, "/v1/chat/completions", body)


_PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "output_text", "text", "input_image", "x"])},
        optional={"text": _SCALARS},
    ),
    max_size=2,
)
_ITEMS = st.one_of(
    _text(20),
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant", "developer", "robot"]),
                 "content": st.one_of(_SCALARS, _PARTS)}
            ),
            st.fixed_dictionaries(
                {"type": st.sampled_from(
                    ["function_call", "function_call_output", "reasoning", "message", "zz"])},
                optional={k: _JUNK for k in
                          ("call_id", "name", "arguments", "output", "content", "summary", "role")},
            ),
            _JUNK,
        ),
        max_size=3,
    ),
    _JUNK,
)  # fmt: skip


@_SETTINGS
@given(
    body=st.fixed_dictionaries(
        {"input": _ITEMS, "max_output_tokens": _MAX_TOKENS},
        optional={
            k: _JUNK
            for k in ("instructions", "tools", "tool_choice", "text", "include", "top_logprobs",
                      "previous_response_id", "reasoning", "model", "temperature", "zz")
        } | {"stream": st.booleans(), "store": st.booleans()},
    )
)  # fmt: skip
def test_fuzz_responses(server, auth, body) -> None:
    _check(server, auth, "/v1/responses", body)


_BLOCKS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(
            ["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "x"])},
        optional={k: _JUNK for k in
                  ("text", "id", "name", "input", "tool_use_id", "content", "thinking")},
    ),
    max_size=3,
)  # fmt: skip


@_SETTINGS
@given(
    body=st.fixed_dictionaries(
        {
            "messages": st.one_of(
                st.lists(
                    st.fixed_dictionaries(
                        {"role": st.sampled_from(["user", "assistant", "system"]),
                         "content": st.one_of(_SCALARS, _BLOCKS)}
                    ),
                    max_size=3,
                ),
                _JUNK,
            ),
            "max_tokens": _MAX_TOKENS,
        },
        optional={k: _JUNK for k in ("system", "tools", "tool_choice", "stop_sequences",
                                     "thinking", "model", "top_k", "zz")}
        | {"stream": st.booleans()},
    )
)  # fmt: skip
def test_fuzz_anthropic_messages(server, auth, body) -> None:
    raw = json.dumps(body)
    status, response = server.request("POST", "/v1/messages", raw, auth)
    assert status < 500, (status, response, raw)
    if status >= 400:
        assert response["type"] == "error" and set(response["error"]) == {"type", "message"}


def test_still_healthy_after_fuzzing(server) -> None:
    assert server.request("GET", "/health")[0] == 200
