"""The token bitmask: int32 words [num_rows, ceil(vocab_size / 32)], bit b of word w set iff
token 32 * w + b is allowed (a numpy array on the host, where the matchers fill it), and its
application to logits on their device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from minivllm.layers.dispatch import use_triton_kernels

BITS_PER_WORD = 32


def num_bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def allocate_bitmask(num_rows: int, vocab_size: int, pin_memory: bool = False) -> torch.Tensor:
    """A CPU bitmask of num_rows rows, every token allowed (all bits set). Pinned memory
    lets the copy to the GPU overlap with the forward."""
    shape = (num_rows, num_bitmask_words(vocab_size))
    return torch.full(shape, -1, dtype=torch.int32, pin_memory=pin_memory)


def byte_token_words(byte_token_ids: Sequence[int]) -> tuple[slice | np.ndarray, np.ndarray]:
    """(words, bits): the bitmask words holding byte_token_ids (one token per byte value, each
    of that one byte), as a slice where they are contiguous (the usual byte-level BPE: the
    256 byte tokens come first), and int32 [len(words)] the bits of those tokens in each;
    what unforced_rows reads."""
    masks: dict[int, int] = {}
    for token_id in byte_token_ids:
        word = token_id // BITS_PER_WORD
        masks[word] = masks.get(word, 0) | 1 << token_id % BITS_PER_WORD
    words = sorted(masks)
    bits = np.array([masks[w] for w in words], dtype=np.uint32).view(np.int32)
    if words and words[-1] - words[0] + 1 == len(words):
        return slice(words[0], words[-1] + 1), bits
    return np.array(words, dtype=np.int64), bits


def unforced_rows(
    bitmask: np.ndarray | torch.Tensor, byte_words: slice | np.ndarray, byte_bits: np.ndarray
) -> list[bool]:
    """Per row, whether it shows that the grammar forces nothing next, so that a forced-token
    lookup there finds none: the row allows two single-byte tokens (two different next bytes;
    byte_words, byte_bits: byte_token_words'), or it is wide (more than a quarter of the 64
    words in the middle of the row allow a token: free text, a string's content). A forced
    state (a JSON key, punctuation) allows a few tokens, all starting with its one next byte.
    Each test reads a few contiguous words a row: the rows are read while the step waits.
    bitmask: int32 [num_rows, num_words], on the CPU."""
    words = np.asarray(bitmask)
    start = max(0, words.shape[1] // 2 - 32)
    block = words[:, start : start + 64]
    # Counts summed in small ints (count_nonzero along an axis sums in intp: slower).
    wide = np.add.reduce(block != 0, axis=1, dtype=np.uint8) > block.shape[1] // 4
    return (wide | _two_bits_set(words[:, byte_words] & byte_bits)).tolist()


def _two_bits_set(allowed: np.ndarray) -> np.ndarray:
    """Per row of int32 words [num_rows, <= 256], whether two or more bits are set in all."""
    if _bitwise_count is not None:  # a popcount per word, summed: the fewest numpy calls
        # Unsigned: numpy counts a signed word's absolute value (-2**30 would count 1 bit).
        bits = _bitwise_count(allowed.view(np.uint32))
        return np.add.reduce(bits, axis=1, dtype=np.uint16) >= 2
    # Two bits set: in two words, or in one (x & (x - 1) != 0; int32 wraps, bit 31 included).
    two_words = np.add.reduce(allowed != 0, axis=1, dtype=np.uint16) >= 2
    return two_words | (allowed & (allowed - 1)).any(axis=1)


# numpy >= 2.0's popcount (None before it: _two_bits_set's other test).
_bitwise_count = getattr(np, "bitwise_count", None)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bitmask: int32 [num_rows, num_words] -> bool [num_rows, vocab_size], True = allowed.
    Ids past the bitmask's 32 * num_words (a model vocab padded past the tokenizer's) are
    not allowed."""
    bits = torch.arange(BITS_PER_WORD, device=bitmask.device, dtype=torch.int32)
    # Arithmetic shift of a negative word is fine: only bit 0 is kept.
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)
    covered = allowed.shape[1]
    if covered >= vocab_size:
        return allowed[:, :vocab_size]
    padding = allowed.new_zeros(allowed.shape[0], vocab_size - covered)
    return torch.cat([allowed, padding], dim=1)


def apply_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | torch.Tensor
) -> None:
    """Sets the disallowed logits of the constrained rows to -inf, in place.

    logits: [num_rows, vocab_size] on any device (vocab_size may exceed the tokenizer's);
    bitmask: int32 [len(rows), num_words], on the CPU (pinned for an async copy) or on
    logits' device; rows: the logits row of each bitmask row. Other rows are untouched.
    """
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be 2-D int32, got {bitmask.dim()}-D {bitmask.dtype}")
    rows = torch.as_tensor(rows, dtype=torch.long).to(logits.device, non_blocking=True)
    if rows.shape != (bitmask.shape[0],):
        raise ValueError(f"{bitmask.shape[0]} bitmask rows but {rows.numel()} logits rows")
    if rows.numel() == 0:
        return
    bitmask = bitmask.to(logits.device, non_blocking=True)
    if use_triton_kernels(logits.device):  # one kernel, writing only the disallowed logits
        from minivllm.kernels.bitmask import mask_logits

        mask_logits(logits, bitmask, rows)
        return
    allowed = unpack_bitmask(bitmask, logits.shape[1])  # [len(rows), vocab_size]
    logits[rows] = torch.where(allowed, logits[rows], float("-inf"))


def drop_eos(
    bitmask: np.ndarray | torch.Tensor, rows: Sequence[int], eos_token_ids: Sequence[int]
) -> None:
    """Clears the EOS bits of bitmask's rows (int32, host), in each row that allows some other
    token: an ignore_eos request's grammar in an accepting state goes on. A row that allows
    only EOS (a grammar that has ended) keeps it."""
    words = np.asarray(bitmask).view(np.uint32)
    eos_words = np.array([t // 32 for t in eos_token_ids], dtype=np.int64)
    keep_bits = np.array([~(1 << (t % 32)) & 0xFFFFFFFF for t in eos_token_ids], dtype=np.uint32)
    for row in rows:
        kept = words[row].copy()
        np.bitwise_and.at(words[row], eos_words, keep_bits)
        if not words[row].any():
            words[row] = kept
