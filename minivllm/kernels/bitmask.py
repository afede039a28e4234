"""A grammar's token bitmask applied to logits in one pass: disallowed ids become -inf.

bitmask: int32 words, bit b of word w set iff token 32 * w + b is allowed
(structured_output/bitmask.py). Program (i, b) reads the words covering vocab block b of
bitmask row i and writes -inf into logits row rows[i] where a bit is clear; allowed logits are
not touched, nor are rows without a bitmask row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor

DEFAULT_BLOCK = 4096


@triton.jit
def _mask_logits_kernel(logits_ptr, logits_stride, bitmask_ptr, bitmask_stride, rows_ptr,
                        vocab_size, num_words, BLOCK: tl.constexpr):  # fmt: skip
    i = tl.program_id(0)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = ids < vocab_size
    word = ids // 32
    # Ids past the bitmask's words (a vocabulary padded past the tokenizer's) are disallowed.
    words = tl.load(bitmask_ptr + i * bitmask_stride + word, mask=in_vocab & (word < num_words),
                    other=0)  # fmt: skip
    allowed = (words >> (ids % 32)) & 1
    row = tl.load(rows_ptr + i)
    tl.store(logits_ptr + row * logits_stride + ids, float("-inf"), mask=in_vocab & (allowed == 0))


def mask_logits(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, block: int = DEFAULT_BLOCK
) -> None:
    """Sets logits[rows[i], t] = -inf for every token t that bitmask row i disallows, in place.

    logits: [num_rows, vocab_size] fp32/fp16/bf16 (last dim contiguous); bitmask: int32
    [len(rows), num_words] (last dim contiguous), on logits' device; rows: int64 [len(rows)],
    distinct logits rows. Grid (len(rows), cdiv(vocab_size, block)); no host sync.
    """
    check_tensor("logits", logits, 2)
    check_tensor("bitmask", bitmask, 2, (torch.int32,))
    check_tensor("rows", rows, 1, (torch.int64,))
    check_same("rows.shape[0]", rows.shape[0], "bitmask.shape[0]", bitmask.shape[0])
    for name, t in (("bitmask", bitmask), ("rows", rows)):
        check_same(f"{name}.device", t.device, "logits.device", logits.device)
    if block < 32 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 32, got {block}")
    num_masked, num_words = bitmask.shape
    vocab_size = logits.shape[1]
    if num_masked == 0 or vocab_size == 0:
        return
    block = min(block, max(triton.next_power_of_2(vocab_size), 32))
    _mask_logits_kernel[(num_masked, triton.cdiv(vocab_size, block))](
        logits,
        logits.stride(0),
        bitmask,
        bitmask.stride(0),
        rows,
        vocab_size,
        num_words,
        BLOCK=block,
    )
