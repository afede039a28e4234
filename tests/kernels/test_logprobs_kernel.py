"""kernels/logprobs.py's two passes give what torch's log_softmax and gather_logprobs give: the
sampled token's logprob and rank, and the top k (ties to the lowest id), on random logits,
coarse ones full of ties, rows mostly -inf (a grammar's mask) and a subset of rows."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.logprobs import token_logprobs
from minivllm.layers.sampler import gather_logprobs

# float32 and float16 in Triton's interpreter; bfloat16 (the models' logits) on the GPU.
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
CHUNK = 64  # small slices: several chunks a row in the interpreter


def reference(logits: torch.Tensor, tokens: torch.Tensor, k: int, rows: torch.Tensor | None):
    """(ids, logprobs, ranks) by torch, the top k ordered by logprob then id (a stable sort:
    torch.topk leaves ties in any order)."""
    picked = logits if rows is None else logits[rows]
    picked_tokens = tokens if rows is None else tokens[rows]
    logprobs = torch.log_softmax(picked.float(), dim=-1)
    _, values, ranks = gather_logprobs(logprobs, picked_tokens, 0)
    k = min(k, logits.shape[1])
    order = torch.sort(-logprobs, dim=-1, stable=True).indices[:, :k]
    ids = torch.cat([picked_tokens.unsqueeze(1), order], 1)
    return ids, torch.cat([values, logprobs.gather(1, order)], 1), ranks


def check(logits: torch.Tensor, tokens: torch.Tensor, k: int, rows=None) -> None:
    dev = [None if t is None else t.to(DEVICE) for t in (logits, tokens, rows)]
    ids, values, ranks = token_logprobs(*dev[:2], k, dev[2], chunk=CHUNK)
    want_ids, want_values, want_ranks = reference(logits, tokens, k, rows)
    assert ids.cpu().tolist() == want_ids.tolist()
    assert ranks.cpu().tolist() == want_ranks.tolist()
    torch.testing.assert_close(values.cpu(), want_values, rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_random_logits_all_rows(dtype, k):
    torch.manual_seed(k)
    logits = (torch.randn(4, 300) * 3).to(dtype)
    tokens = torch.randint(0, 300, (4,))
    check(logits, tokens, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_go_to_the_lowest_id_and_ranks_count_strictly_larger(dtype):
    torch.manual_seed(1)
    # Integers in [0, 4): every value is tied with dozens of others, across chunks.
    logits = torch.randint(0, 4, (3, 257)).to(dtype)
    tokens = torch.tensor([0, 100, 256])
    check(logits, tokens, 20)
    check(logits, tokens, 7, rows=torch.tensor([2, 0]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_rows_report_their_few_tokens_then_the_lowest_masked_ids(dtype):
    torch.manual_seed(2)
    logits = torch.randn(3, 200).to(dtype)
    logits[0, :] = -torch.inf
    logits[0, [150, 7, 90]] = torch.tensor([1.0, 2.0, 1.0]).to(dtype)  # three allowed tokens
    logits[1, 100:] = -torch.inf
    tokens = torch.tensor([90, 5, 199])
    check(logits, tokens, 6)


def test_a_subset_of_rows_and_k_past_the_vocabulary():
    torch.manual_seed(3)
    logits = torch.randn(5, 40)
    tokens = torch.randint(0, 40, (5,))
    check(logits, tokens, 3, rows=torch.tensor([4, 1, 3]))
    check(logits[:, :12], tokens % 12, 20, rows=torch.tensor([0]))  # k clipped to the vocab
    none = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    ids, values, ranks = token_logprobs(logits.to(DEVICE), tokens.to(DEVICE), 2, none)
    assert ids.shape == (0, 3) and values.shape == (0, 3) and ranks.shape == (0,)


def test_bad_arguments_are_clear_errors():
    logits = torch.randn(2, 32, device=DEVICE)
    tokens = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    for k in (-1, 21):
        with pytest.raises(ValueError, match="num_logprobs"):
            token_logprobs(logits, tokens, k)
    with pytest.raises(ValueError, match="token_ids"):
        token_logprobs(logits, tokens.int(), 1)
    with pytest.raises(ValueError, match="chunk"):
        token_logprobs(logits, tokens, 1, chunk=48)
