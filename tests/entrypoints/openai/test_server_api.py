"""The OpenAI surface of `minivllm serve`, driven by the official client and raw HTTP."""

from __future__ import annotations

import asyncio

import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.entrypoints.conftest import API_KEY, MODEL_NAME

PROMPT_IDS = [11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133]
GREEDY = dict(temperature=0.0, max_tokens=16, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def offline(tiny_qwen3_dir: str) -> LLM:
    """The offline API on the same model and settings: the server's oracle."""
    return LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)


def test_models_version_health(server, client, auth) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME, "other-name"]
    assert models[0].model_extra["max_model_len"] == 512
    assert server.request("GET", "/health")[0] == 200
    assert server.request("GET", "/version", headers=auth)[1]["version"]


def test_completion_matches_offline(client, offline) -> None:
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT_IDS, logprobs=3, **GREEDY)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3)
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS}, params, use_tqdm=False)[0].outputs[0]
    choice = out.choices[0]
    assert choice.text == ref.text and choice.finish_reason == "length"
    ref_logprobs = [d[t].logprob for d, t in zip(ref.logprobs, ref.token_ids)]
    assert choice.logprobs.token_logprobs == pytest.approx(ref_logprobs, abs=1e-4)
    assert len(choice.logprobs.top_logprobs[0]) >= 3
    assert out.usage.prompt_tokens == len(PROMPT_IDS) and out.usage.completion_tokens == 16


def test_logit_bias_matches_offline(client, offline) -> None:
    # Keys are token ids as strings; biases are clamped to [-100, 100] as in the OpenAI API.
    bias = {"7": 500.0, "9": -3.5}
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT_IDS, logit_bias=bias, **GREEDY)
    params = SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True, logit_bias={7: 100.0, 9: -3.5}
    )
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS}, params, use_tqdm=False)[0].outputs[0]
    assert ref.token_ids == [7] * 16
    assert out.choices[0].text == ref.text


def test_allowed_token_ids_match_offline(client, offline) -> None:
    params = SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True, allowed_token_ids=[5, 7, 9]
    )
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS}, params, use_tqdm=False)[0].outputs[0]
    assert set(ref.token_ids) <= {5, 7, 9}
    out = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT_IDS, temperature=0.0, max_tokens=16,
        extra_body={"ignore_eos": True, "allowed_token_ids": [5, 7, 9], "return_token_ids": True},
    )  # fmt: skip
    assert out.choices[0].model_extra["token_ids"] == ref.token_ids


def test_bad_words_match_offline(client, offline) -> None:
    free = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    first = offline.generate({"prompt_token_ids": PROMPT_IDS}, free, use_tqdm=False)[0].outputs[0]
    word = offline.get_tokenizer().decode(first.token_ids[:1])
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, bad_words=[word])
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS}, params, use_tqdm=False)[0].outputs[0]
    assert ref.token_ids[0] != first.token_ids[0]
    out = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT_IDS, temperature=0.0, max_tokens=16,
        extra_body={"ignore_eos": True, "bad_words": [word], "return_token_ids": True},
    )  # fmt: skip
    assert out.choices[0].model_extra["token_ids"] == ref.token_ids


def test_chat_echo_puts_the_continued_message_first(client) -> None:
    messages = [
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "One, two,"},
    ]
    body = {"continue_final_message": True, "add_generation_prompt": False, "ignore_eos": True}
    kwargs = dict(model=MODEL_NAME, messages=messages, temperature=0.0, max_tokens=8)
    plain = client.chat.completions.create(**kwargs, extra_body=body)
    echoed = client.chat.completions.create(**kwargs, extra_body={**body, "echo": True})
    text = plain.choices[0].message.content
    assert echoed.choices[0].message.content == "One, two," + text
    chunks = list(client.chat.completions.create(**kwargs, stream=True,
                                                 extra_body={**body, "echo": True}))  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == "One, two," + text
    # The last message is the user's: nothing to echo.
    user_last = client.chat.completions.create(
        model=MODEL_NAME, messages=messages[:1], temperature=0.0, max_tokens=4,
        extra_body={"echo": True},
    )  # fmt: skip
    assert not user_last.choices[0].message.content.startswith("Count.")


def test_a_client_named_request_keeps_its_name(client, server, auth) -> None:
    base = dict(model=MODEL_NAME, prompt=PROMPT_IDS, max_tokens=2)
    assert client.completions.create(**base, extra_body={"request_id": "job-7"}).id == "cmpl-job-7"
    header = {"X-Request-Id": "trace-1"}
    named = client.completions.create(
        **base, extra_body={"request_id": "job-7"}, extra_headers=header
    )
    assert named.id == "cmpl-trace-1"  # the header wins, as in vLLM
    messages = [{"role": "user", "content": "Hi"}]
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=2, stream=True, extra_headers=header
    ))  # fmt: skip
    assert {c.id for c in chunks} == {"chatcmpl-trace-1"}

    async def twice() -> list[str]:  # one name, two requests at once: both are served
        async_client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY)
        outs = await asyncio.gather(
            *(async_client.completions.create(**base, extra_headers=header) for _ in range(2))
        )
        return [o.id for o in outs]

    assert asyncio.run(twice()) == ["cmpl-trace-1"] * 2
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1, "request_id": "a\nb"}
    status, error = server.request("POST", "/v1/completions", body, auth)
    assert status == 400 and error["error"]["param"] == "request_id"


def test_chat_logprobs_match_offline(client, offline) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, logprobs=True, top_logprobs=2, **GREEDY
    )
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
    ref = offline.chat(messages, params, use_tqdm=False)[0].outputs[0]
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == ref.text
    got = [c.logprob for c in choice.logprobs.content]
    assert got == pytest.approx(
        [d[t].logprob for d, t in zip(ref.logprobs, ref.token_ids)], abs=1e-4
    )
    assert all(len(c.top_logprobs) == 2 for c in choice.logprobs.content)


def _check_prompt_logprobs(got: list, ref: list) -> None:
    """vLLM's shape, None first, then {"token id": {"logprob", "rank", "decoded_token"}}, with
    the values of the offline API's prompt_logprobs."""
    assert got[0] is None and len(got) == len(ref)
    for entry, ref_entry in zip(got[1:], ref[1:]):
        assert {int(k) for k in entry} == set(ref_entry)
        for k, value in entry.items():
            expected = ref_entry[int(k)]
            assert value["logprob"] == pytest.approx(expected.logprob, abs=1e-4)
            assert value["rank"] == expected.rank
            assert value["decoded_token"] == expected.decoded_token


def test_prompt_logprobs_match_offline(client, offline) -> None:
    # Asked beside echo's logprobs of another k: each keeps its own top ranks.
    out = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT_IDS, echo=True, logprobs=1, max_tokens=1,
        temperature=0.0, extra_body={"prompt_logprobs": 3},
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=3)
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS}, params, use_tqdm=False)[0]
    _check_prompt_logprobs(out.choices[0].model_extra["prompt_logprobs"], ref.prompt_logprobs)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS}, params, use_tqdm=False)[0]
    echoed = out.choices[0].logprobs
    assert echoed.token_logprobs[0] is None
    assert echoed.token_logprobs[1 : len(PROMPT_IDS)] == pytest.approx(
        [e[t].logprob for e, t in zip(ref.prompt_logprobs[1:], PROMPT_IDS[1:])], abs=1e-4
    )
    assert [len(t) for t in echoed.top_logprobs[1 : len(PROMPT_IDS)]] == [
        len({lp.decoded_token for lp in e.values()}) for e in ref.prompt_logprobs[1:]
    ]

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=1, extra_body={"prompt_logprobs": 2}
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=2)
    ref = offline.chat(messages, params, use_tqdm=False)[0]
    _check_prompt_logprobs(out.model_extra["prompt_logprobs"], ref.prompt_logprobs)


def test_return_token_ids_match_offline(client, offline) -> None:
    # vLLM's return_token_ids: the prompt's ids and the output's beside the text; streamed,
    # the prompt's in the first chunk of a choice and each chunk with its own delta's ids.
    ids = dict(extra_body={"return_token_ids": True, "ignore_eos": True})
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT_IDS, temperature=0.0, max_tokens=16, n=2)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS}, params, use_tqdm=False)[0]
    out = client.completions.create(**kwargs, **ids)
    for choice in out.choices:
        assert choice.model_extra["prompt_token_ids"] == PROMPT_IDS
        assert choice.model_extra["token_ids"] == ref.outputs[0].token_ids
    streamed, prompts = {0: [], 1: []}, {0: [], 1: []}
    for chunk in client.completions.create(stream=True, **kwargs, **ids):
        for choice in chunk.choices:
            streamed[choice.index] += choice.model_extra["token_ids"]
            if choice.model_extra.get("prompt_token_ids") is not None:
                prompts[choice.index].append(choice.model_extra["prompt_token_ids"])
    assert streamed == {0: ref.outputs[0].token_ids, 1: ref.outputs[0].token_ids}
    assert prompts == {0: [PROMPT_IDS], 1: [PROMPT_IDS]}

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ref = offline.chat(messages, params, use_tqdm=False)[0]
    kwargs = dict(model=MODEL_NAME, messages=messages, temperature=0.0, max_tokens=16)
    out = client.chat.completions.create(**kwargs, **ids)
    assert out.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    assert out.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
    streamed, prompts = [], []
    for chunk in client.chat.completions.create(stream=True, **kwargs, **ids):
        if chunk.model_extra.get("prompt_token_ids") is not None:
            prompts.append(chunk.model_extra["prompt_token_ids"])
        for choice in chunk.choices:
            streamed += choice.model_extra.get("token_ids") or []
    assert prompts == [ref.prompt_token_ids] and streamed == ref.outputs[0].token_ids


def test_truncate_prompt_tokens_matches_offline(client, offline) -> None:
    # The tiny model's tokenizer cuts on the right (transformers' default): the first k kept.
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ref = offline.generate({"prompt_token_ids": PROMPT_IDS[:5]}, params, use_tqdm=False)[0]
    out = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT_IDS, temperature=0.0, max_tokens=8, echo=True,
        extra_body={"truncate_prompt_tokens": 5, "ignore_eos": True},
    )  # fmt: skip
    assert out.usage.prompt_tokens == 5
    assert (
        out.choices[0].text == offline.get_tokenizer().decode(PROMPT_IDS[:5]) + ref.outputs[0].text
    )
    # A text longer than any prompt that fits is taken when the request cuts it (-1: what
    # max_model_len, 512, leaves beside max_tokens).
    out = client.completions.create(
        model=MODEL_NAME, prompt="hello world " * 3000, temperature=0.0, max_tokens=12,
        extra_body={"truncate_prompt_tokens": -1},
    )  # fmt: skip
    assert out.usage.prompt_tokens == 500
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "What is the capital?"}],
        max_tokens=4, extra_body={"truncate_prompt_tokens": 3, "return_token_ids": True},
    )  # fmt: skip
    assert chat.usage.prompt_tokens == 3 and len(chat.model_extra["prompt_token_ids"]) == 3


def _stream_text(stream) -> tuple[str, list, object]:
    texts, finish, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts.append(text)
            finish.append(c.finish_reason)
    return "".join(texts), finish, usage


@pytest.mark.parametrize("stop", [None, "e"])
def test_streaming_equals_non_streaming(client, stop) -> None:
    kwargs = dict(model=MODEL_NAME, prompt="The quick brown fox", stop=stop, **GREEDY)
    full = client.completions.create(**kwargs)
    stream = client.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    )
    text, finish, usage = _stream_text(stream)
    assert text == full.choices[0].text
    assert finish[-1] == full.choices[0].finish_reason and all(f is None for f in finish[:-1])
    assert usage.completion_tokens == full.usage.completion_tokens


def test_chat_streaming_first_chunk_has_role(client) -> None:
    messages = [{"role": "user", "content": "Hello, world!"}]
    full = client.chat.completions.create(model=MODEL_NAME, messages=messages, **GREEDY)
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_stop_string_cuts_text(client) -> None:
    base = client.completions.create(model=MODEL_NAME, prompt="Hello", **GREEDY).choices[0].text
    stop = base[4:6]
    cut = client.completions.create(model=MODEL_NAME, prompt="Hello", stop=[stop], **GREEDY)
    choice = cut.choices[0]
    assert choice.text == base[: base.find(stop)]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == stop


def test_n2_and_multiple_prompts(client) -> None:
    out = client.completions.create(
        model=MODEL_NAME,
        prompt=["Hello", "One, two"],
        n=2,
        temperature=1.0,
        seed=7,
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 4 * 8
    assert out.choices[0].text != out.choices[1].text  # each sample has its own seed stream
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hi"}],
        n=2,
        temperature=1.0,
        seed=3,
        max_completion_tokens=8,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.usage.completion_tokens == 16


def test_cached_tokens_on_repeated_prompt(client) -> None:
    prompt = list(range(100, 141))  # 41 tokens: 10 full blocks of 4 can be hit
    first = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=2)
    second = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 40


def test_cache_salt_keeps_tenants_apart(client) -> None:
    prompt = list(range(200, 241))  # 41 tokens: 10 full blocks of 4 can be hit

    def cached(salt: str) -> int:
        body = {"cache_salt": salt}
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=2, extra_body=body
        )
        return out.usage.prompt_tokens_details.cached_tokens

    assert [cached("tenant-a"), cached("tenant-a"), cached("tenant-b")] == [0, 40, 0]
    messages = [{"role": "user", "content": "Hello there, how are you today?"}]
    chat = [
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=1, extra_body={"cache_salt": salt}
        ).usage.prompt_tokens_details.cached_tokens
        for salt in ("chat-a", "chat-a", "chat-b")
    ]
    assert chat[0] == chat[2] == 0 and chat[1] > 0


def test_echo_and_default_max_tokens(client, server) -> None:
    out = client.completions.create(
        model=MODEL_NAME, prompt="Hello", echo=True, max_tokens=3, temperature=0.0
    )
    assert out.choices[0].text.startswith("Hello")
    # Without max_tokens, the default is what fits in max_model_len (512 - prompt).
    long_prompt = [i % 400 + 1 for i in range(505)]
    out = client.completions.create(
        model=MODEL_NAME, prompt=long_prompt, temperature=0.0, extra_body={"ignore_eos": True}
    )
    assert out.usage.completion_tokens == 512 - 505 and out.choices[0].finish_reason == "length"


def test_tokenize_detokenize(server, auth) -> None:
    status, body = server.request("POST", "/tokenize", {"prompt": "Hello, world!"}, auth)
    assert status == 200 and body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    status, back = server.request("POST", "/detokenize", {"tokens": body["tokens"]}, auth)
    assert status == 200 and back["prompt"] == "Hello, world!"
    status, chat = server.request(
        "POST", "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}, auth
    )
    assert status == 200 and chat["count"] > 3


async def _one_stream(async_client, i: int) -> str:
    stream = await async_client.completions.create(
        model=MODEL_NAME, prompt=[i + 1, i + 2, i + 3], stream=True, **GREEDY
    )
    return "".join([c.choices[0].text async for c in stream if c.choices])


def test_64_concurrent_streams(server, offline) -> None:
    async def run() -> list[str]:
        url = server.base_url + "/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0) as client:
            return await asyncio.gather(*(_one_stream(client, i) for i in range(64)))

    texts = asyncio.run(run())
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": [i + 1, i + 2, i + 3]} for i in range(64)]
    refs = [o.outputs[0].text for o in offline.generate(prompts, params, use_tqdm=False)]
    assert texts == refs


def test_api_key(server) -> None:
    assert server.request("GET", "/v1/models")[0] == 401
    status, body = server.request("GET", "/v1/models", headers={"Authorization": "Bearer nope"})
    assert status == 401 and body["error"]["code"] == 401
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert server.request("GET", "/health")[0] == 200  # open, as in vLLM
    assert API_KEY not in server.logs()
