"""add_special_tokens and return_tokens_as_token_ids through the server, on a tiny model whose
tokenizer puts a BOS before each text (as Llama's does; the tiny model's own adds nothing, so
the flag would change nothing there)."""

from __future__ import annotations

import shutil

import openai
import pytest
from tokenizers import Tokenizer, processors

from minivllm.tokenizer import load_tokenizer
from tests.entrypoints.conftest import MODEL_NAME, Server

BOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def bos_model_dir(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny-bos") / "model"
    shutil.copytree(tiny_qwen3_dir, path)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, bos_id)]
    )
    tokenizer.save(str(path / "tokenizer.json"))
    return str(path)


@pytest.fixture(scope="module")
def client(bos_model_dir: str, tmp_path_factory: pytest.TempPathFactory):
    srv = Server(bos_model_dir, str(tmp_path_factory.mktemp("serve-bos") / "server.log"))
    yield openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)
    srv.stop()


def prompt_ids(out) -> list[int]:
    extra = (
        out.model_extra if out.model_extra.get("prompt_token_ids") else out.choices[0].model_extra
    )
    return extra["prompt_token_ids"]


def test_add_special_tokens_is_the_tokenizers_bos(client, bos_model_dir):
    tokenizer = load_tokenizer(bos_model_dir)
    bos_id = tokenizer.convert_tokens_to_ids(BOS)
    text = tokenizer.encode("Hello there", add_special_tokens=False)
    assert tokenizer.encode("Hello there") == [bos_id, *text]
    base = dict(model=MODEL_NAME, max_tokens=1)

    def completion(**extra):
        body = {"return_token_ids": True, **extra}
        return prompt_ids(client.completions.create(prompt="Hello there", extra_body=body, **base))

    assert completion() == [bos_id, *text]  # completions: True by default, as vLLM
    assert completion(add_special_tokens=False) == text

    def chat(**extra):
        messages = [{"role": "user", "content": "Hello there"}]
        body = {"return_token_ids": True, **extra}
        return prompt_ids(
            client.chat.completions.create(messages=messages, extra_body=body, **base)
        )

    rendered = chat()  # chat: False by default (the template writes the special tokens)
    assert rendered[0] != bos_id
    assert chat(add_special_tokens=True) == [bos_id, *rendered]


def test_logprobs_tokens_as_token_ids(client):
    base = dict(model=MODEL_NAME, max_tokens=4, temperature=0.0)
    body = {"return_tokens_as_token_ids": True, "return_token_ids": True}
    out = client.completions.create(prompt="Hi", logprobs=2, extra_body=body, **base)
    choice = out.choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.model_extra["token_ids"]]
    for top in choice.logprobs.top_logprobs:
        assert all(key.startswith("token_id:") for key in top)
    messages = [{"role": "user", "content": "Hi"}]
    out = client.chat.completions.create(
        messages=messages, logprobs=True, top_logprobs=2, extra_body=body, **base
    )
    choice = out.choices[0]
    entries = choice.logprobs.content
    assert [e.token for e in entries] == [f"token_id:{t}" for t in choice.model_extra["token_ids"]]
    assert all(t.token.startswith("token_id:") for e in entries for t in e.top_logprobs)
    assert entries[0].bytes == list(entries[0].token.encode())
    plain = client.chat.completions.create(messages=messages, logprobs=True, **base)
    got = [e.logprob for e in plain.choices[0].logprobs.content]
    assert got == pytest.approx([e.logprob for e in entries], abs=1e-5)
