"""The tokenizer built from a GGUF file is kept in a cache directory and loaded from there next
time: the cached one tokenizes, detokenizes and renders chat (tools included) exactly as the
one transformers builds from the file (the oracle), and the cache is keyed, atomic and
optional."""

from __future__ import annotations

import os
import shutil

import pytest
from transformers import AutoTokenizer

from minivllm.tokenizer import gguf_tokenizer_cache_dir, load_tokenizer

TEXTS = [
    "Hello, my name is",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Unicode: Ωmega, naïve café, 日本語, emoji 🍕🎉",
    'def f(x):\n    return {"a": [1, 2.5e-3, null]}\n',
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path / "cache"))
    return str(tmp_path / "cache")


@pytest.fixture(scope="module")
def oracle(demo_gguf: str):
    """The tokenizer transformers builds from the file itself."""
    directory, name = os.path.split(demo_gguf)
    return AutoTokenizer.from_pretrained(directory, gguf_file=name)


def test_the_cached_tokenizer_is_the_gguf_one(demo_gguf: str, cache_dir: str, oracle) -> None:
    first = load_tokenizer(demo_gguf)  # builds it and fills the cache
    cached_dir = gguf_tokenizer_cache_dir(demo_gguf)
    assert cached_dir.startswith(cache_dir) and os.path.isfile(
        os.path.join(cached_dir, "tokenizer.json")
    )
    cached = load_tokenizer(demo_gguf)
    for tokenizer in (first, cached):
        assert len(tokenizer) == len(oracle)
        assert tokenizer.special_tokens_map == oracle.special_tokens_map
        assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (
            oracle.bos_token_id,
            oracle.eos_token_id,
        )
        for text in TEXTS:
            ids = oracle.encode(text)
            assert tokenizer.encode(text) == ids
            assert tokenizer.decode(ids) == oracle.decode(ids)
            assert tokenizer.decode(ids, skip_special_tokens=True) == oracle.decode(
                ids, skip_special_tokens=True
            )
        for tools in (None, TOOLS):
            rendered = oracle.apply_chat_template(
                MESSAGES, tools=tools, tokenize=False, add_generation_prompt=True
            )
            assert (
                tokenizer.apply_chat_template(
                    MESSAGES, tools=tools, tokenize=False, add_generation_prompt=True
                )
                == rendered
            )


def test_a_rewritten_file_gets_another_entry(demo_gguf: str, tmp_path, cache_dir: str) -> None:
    copy = str(tmp_path / "model.gguf")
    shutil.copyfile(demo_gguf, copy)
    before = gguf_tokenizer_cache_dir(copy)
    assert gguf_tokenizer_cache_dir(copy) == before
    os.utime(copy, ns=(1, 1))
    assert gguf_tokenizer_cache_dir(copy) != before
    assert gguf_tokenizer_cache_dir(demo_gguf) != before


def test_an_entry_written_meanwhile_wins_and_no_partial_is_left(
    demo_gguf: str, cache_dir: str, oracle
) -> None:
    """Another process filled the entry between this one's miss and its write: its files stay,
    this one's temporary directory goes."""
    from minivllm.tokenizer import _save_to_cache

    cached_dir = gguf_tokenizer_cache_dir(demo_gguf)
    os.makedirs(cached_dir)
    marker = os.path.join(cached_dir, "written-by-the-other")
    open(marker, "w").close()
    _save_to_cache(oracle, cached_dir)
    assert os.listdir(cached_dir) == ["written-by-the-other"]
    assert os.listdir(os.path.dirname(cached_dir)) == [os.path.basename(cached_dir)]


def test_an_unwritable_cache_is_skipped(demo_gguf: str, tmp_path, monkeypatch, oracle) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(blocked))
    tokenizer = load_tokenizer(demo_gguf)
    assert tokenizer.encode("Hello, café 🍕") == oracle.encode("Hello, café 🍕")
