"""The bitmask layout and apply_bitmask against a per-element reference loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.structured_output import allocate_bitmask, apply_bitmask, num_bitmask_words
from minivllm.structured_output.bitmask import byte_token_words, unforced_rows, unpack_bitmask


def reference_apply(logits, bitmask, rows):
    out = logits.clone()
    for i, row in enumerate(rows):
        for token in range(logits.shape[1]):
            word, bit = divmod(token, 32)
            allowed = word < bitmask.shape[1] and (int(bitmask[i, word]) >> bit) & 1
            if not allowed:
                out[row, token] = float("-inf")
    return out


def random_bitmask(num_rows, vocab_size, generator):
    allowed = torch.rand(num_rows, num_bitmask_words(vocab_size) * 32, generator=generator) < 0.5
    weights = 1 << torch.arange(32, dtype=torch.int64)
    words = (allowed.view(num_rows, -1, 32).long() * weights).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # bit 31 = sign


def test_layout():
    assert [num_bitmask_words(v) for v in (1, 32, 33, 64, 49152)] == [1, 1, 2, 2, 1536]
    bitmask = allocate_bitmask(3, 70)
    assert bitmask.shape == (3, 3) and bitmask.dtype == torch.int32
    assert unpack_bitmask(bitmask, 70).all()
    one = torch.tensor([[1 << 5, -(2**31)]], dtype=torch.int32)  # tokens 5 and 63
    assert unpack_bitmask(one, 64)[0].nonzero().flatten().tolist() == [5, 63]


@pytest.mark.parametrize(
    "vocab_size, logits_vocab", [(1, 1), (31, 31), (32, 32), (33, 40), (70, 100)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_matches_reference(vocab_size, logits_vocab, dtype):
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(5, logits_vocab, generator=generator).to(dtype)
    rows = [3, 0, 4]
    bitmask = random_bitmask(len(rows), vocab_size, generator)
    expected = reference_apply(logits, bitmask, rows)
    apply_bitmask(logits, bitmask, torch.tensor(rows))
    assert torch.equal(logits, expected)  # rows 1 and 2 untouched, ids >= 32 * words masked


def test_no_rows_and_bad_arguments():
    logits = torch.zeros(2, 8)
    apply_bitmask(logits, torch.zeros(0, 1, dtype=torch.int32), [])
    assert (logits == 0).all()
    with pytest.raises(ValueError, match="int32"):
        apply_bitmask(logits, torch.zeros(1, 1, dtype=torch.int64), [0])
    with pytest.raises(ValueError, match="1 bitmask rows but 2 logits rows"):
        apply_bitmask(logits, torch.zeros(1, 1, dtype=torch.int32), [0, 1])


@pytest.mark.parametrize("vocab_size", [500, 49152])
def test_unforced_rows_wide(vocab_size):
    """Wide: tokens in more than a quarter of the row's words (a free-text state)."""
    words = num_bitmask_words(vocab_size)
    bitmask = torch.zeros(5, words, dtype=torch.int32)
    bitmask[0] = -1  # every token
    bitmask[1, 3] = 1 << 4  # one token
    bitmask[2, ::2] = 7  # three tokens in every other word
    bitmask[3, : words // 10] = -1  # the first tenth of the vocabulary
    bitmask[4, : words // 2] = 1  # one token in each word of the first half
    no_byte_tokens = byte_token_words([])
    assert unforced_rows(bitmask, *no_byte_tokens) == [True, False, True, False, True]


def test_unforced_rows_two_byte_tokens():
    """Two allowed single-byte tokens (in one word or two, bit 31 included) mean two next
    bytes: unforced. One of them, or other tokens however many, tells nothing."""
    byte_ids = [5, 31, 40, 70]
    byte_words, byte_bits = byte_token_words(byte_ids)
    assert byte_words == slice(0, 3)
    assert byte_bits.view(np.uint32).tolist() == [(1 << 5) | (1 << 31), 1 << 8, 1 << 6]
    scattered_words, _ = byte_token_words([5, 31, 40, 300])
    assert scattered_words.tolist() == [0, 1, 9]
    bitmask = torch.zeros(6, num_bitmask_words(500), dtype=torch.int32)

    def allow(row, *token_ids):
        for t in token_ids:
            word = bitmask[row, t // 32].item() | (1 << t % 32)
            bitmask[row, t // 32] = word - (1 << 32) if word >= 1 << 31 else word

    allow(0, 5, 31)  # one word
    allow(1, 31, 70)  # two words, bit 31
    allow(2, 40)  # one byte token
    allow(3, 40, 41, 42, 100, 200)  # one byte token and others
    allow(4, 6, 7, 8, 9)  # no byte token
    allow(5, 5, 40, 70)
    assert unforced_rows(bitmask, byte_words, byte_bits) == [True, True, False, False, False, True]
    scattered = byte_token_words([5, 31, 40, 70, 300])
    allow(4, 300)
    assert unforced_rows(bitmask, *scattered) == [True, True, False, False, False, True]
