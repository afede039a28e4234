"""The bitmask kernel against apply_bitmask's torch definition: the same logits, disallowed
ids -inf, allowed ones and unmasked rows untouched, padded vocabularies and blocks."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.bitmask import mask_logits
from minivllm.structured_output import allocate_bitmask, apply_bitmask, num_bitmask_words

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def random_bitmask(num_rows: int, num_words: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31, (num_rows, num_words), generator=generator,
                         dtype=torch.int64).to(torch.int32)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "tokenizer_vocab, logits_vocab, block", [(100, 100, 32), (1000, 1000, 256), (70, 130, 64)]
)
def test_equals_the_torch_definition(dtype, tokenizer_vocab, logits_vocab, block) -> None:
    generator = torch.Generator().manual_seed(logits_vocab + block)
    logits = torch.randn(6, logits_vocab, generator=generator).to(dtype)
    bitmask = random_bitmask(3, num_bitmask_words(tokenizer_vocab), generator)
    bitmask[1] = 0  # nothing allowed
    bitmask[2, 0] = 1 << 7  # token 7 alone in its word
    rows = torch.tensor([4, 0, 2])
    expected = logits.clone()
    apply_bitmask(expected, bitmask, rows)  # torch on the CPU
    got = logits.to(DEVICE)
    mask_logits(got, bitmask.to(DEVICE), rows.to(DEVICE), block=block)
    assert torch.equal(got.cpu(), expected)
    assert torch.equal(got.cpu()[[1, 3, 5]], logits[[1, 3, 5]])  # rows without a mask
    assert torch.isinf(expected[0]).all()  # the all-zero mask row (logits row 0)


def test_all_allowed_changes_nothing_and_bad_arguments() -> None:
    logits = torch.randn(2, 50).to(DEVICE)
    before = logits.clone()
    mask_logits(logits, allocate_bitmask(2, 50).to(DEVICE), torch.tensor([0, 1]).to(DEVICE))
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="int32"):
        mask_logits(logits, torch.zeros(2, 2, dtype=torch.int64, device=DEVICE),
                    torch.tensor([0, 1]).to(DEVICE))  # fmt: skip
    with pytest.raises(ValueError, match="rows.shape"):
        mask_logits(logits, allocate_bitmask(2, 50).to(DEVICE), torch.tensor([0]).to(DEVICE))
