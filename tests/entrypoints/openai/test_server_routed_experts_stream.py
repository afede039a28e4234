"""`routed_experts` from a real `minivllm serve --enable-return-routed-experts` (the tiny
Qwen3-MoE), read by the official client: each streamed chunk carries the rows that came with
its tokens (the prompt's with a choice's first), and a choice's chunks, concatenated, are its
non-streamed array and the offline LLM.generate routing; a server without the option answers
a request asking for them with a 400 before the stream starts."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.entrypoints.conftest import MODEL_NAME, Server
from tests.models.hf_greedy import cpu_llm

PROMPTS = [[5, 17, 42, 99, 3, 8, 1], [100, 200, 300]]
MAX_TOKENS = 6
OPTIONS = dict(model=MODEL_NAME, temperature=0.0, max_tokens=MAX_TOKENS)
IDS = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def moe_client(tiny_qwen3_moe_dir: str, tmp_path_factory) -> Iterator[openai.OpenAI]:
    log = str(tmp_path_factory.mktemp("serve-moe") / "server.log")
    server = Server(tiny_qwen3_moe_dir, log, "--enable-return-routed-experts")
    yield openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    server.stop()


@pytest.fixture(scope="module")
def offline(tiny_qwen3_moe_dir: str) -> LLM:
    return cpu_llm(tiny_qwen3_moe_dir, enable_return_routed_experts=True)


def decode(choice) -> np.ndarray | None:
    encoded = choice.model_extra.get("routed_experts")
    if encoded is None:
        return None
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_completions_stream_joins_to_the_full_array(moe_client, offline) -> None:
    requests = [{"prompt_token_ids": p} for p in PROMPTS]
    outputs = offline.generate(requests, greedy(), use_tqdm=False)
    refs = [o.outputs[0].routed_experts for o in outputs]
    full = moe_client.completions.create(prompt=PROMPTS, extra_body=IDS, **OPTIONS)
    for choice, ref, prompt in zip(full.choices, refs, PROMPTS, strict=True):
        assert ref.shape == (len(prompt) + MAX_TOKENS - 1, 2, 2)  # 2 sparse layers, top-2
        np.testing.assert_array_equal(decode(choice), ref)
        assert decode(choice).dtype == ref.dtype == np.uint8
    rows: dict[int, list[np.ndarray]] = {0: [], 1: []}
    sent = {0: 0, 1: 0}  # tokens streamed so far
    stream = moe_client.completions.create(prompt=PROMPTS, stream=True, extra_body=IDS, **OPTIONS)
    for chunk in stream:
        for choice in chunk.choices:
            sent[choice.index] += len(choice.model_extra["token_ids"])
            part = decode(choice)
            if part is not None:
                rows[choice.index].append(part)
            # Rows never run ahead of the tokens sent: the prompt's (the last of them its first
            # token's forward), then one for each later token; under load a row can come a
            # chunk after its token.
            num_rows = sum(len(r) for r in rows[choice.index])
            assert num_rows <= len(PROMPTS[choice.index]) - 1 + sent[choice.index]
    for index, ref in enumerate(refs):
        np.testing.assert_array_equal(np.concatenate(rows[index]), ref)
    # return_routed_experts: false leaves them out, streamed or not.
    off = {"ignore_eos": True, "return_routed_experts": False}
    stream = moe_client.completions.create(prompt=PROMPTS, stream=True, extra_body=off, **OPTIONS)
    assert all(decode(c) is None for chunk in stream for c in chunk.choices)


def test_chat_stream_joins_to_the_full_array(moe_client, offline) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ref = offline.chat(messages, greedy(), use_tqdm=False)[0]
    full = moe_client.chat.completions.create(messages=messages, extra_body=IDS, **OPTIONS)
    assert full.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    np.testing.assert_array_equal(decode(full.choices[0]), ref.outputs[0].routed_experts)
    stream = moe_client.chat.completions.create(
        messages=messages, stream=True, extra_body={**IDS, "return_routed_experts": True}, **OPTIONS
    )
    parts = [decode(c) for chunk in stream for c in chunk.choices]
    assert parts[0] is None  # the role's chunk, before any token
    # The first tokens come with the prompt's rows (its forward produced the first token).
    assert len(parts[1]) >= len(ref.prompt_token_ids)
    rows = [part for part in parts[1:] if part is not None]
    np.testing.assert_array_equal(np.concatenate(rows), ref.outputs[0].routed_experts)


def test_asked_of_a_server_without_the_option_is_a_400(server, client) -> None:
    ask = {"return_routed_experts": True}
    for create, body in [
        (client.completions.create, dict(prompt=[1, 2, 3])),
        (client.chat.completions.create, dict(messages=[{"role": "user", "content": "hi"}])),
    ]:
        with pytest.raises(openai.BadRequestError) as error:
            create(model=MODEL_NAME, max_tokens=2, stream=True, extra_body=ask, **body)
        assert error.value.status_code == 400
        assert error.value.body["param"] == "return_routed_experts"
        assert "--enable-return-routed-experts" in error.value.body["message"]
