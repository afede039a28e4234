"""The Triton filter thresholds (kernels/filter_thresholds.py) against the torch path and a
token-by-token definition: ties (inside and past a chunk's candidates), top_p near 0 and 1,
top_k above the vocabulary, min_p, greedy rows."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels import filter_thresholds as kernel
from minivllm.layers.sampling_filters import keep_thresholds
from tests.layers.test_sampling_filters import CASES, kept_by_definition

# Stage-1 slices of 64 on the CPU: Triton's interpreter sorts slowly (a 4,096-wide sort takes
# it most of a minute); the GPU runs the default.
CHUNK = kernel.CHUNK if DEVICE == "cuda" else 64


def both(logits, temperature, top_k, top_p, min_p):
    """(kernel's, torch path's) thresholds [N] for list parameters; min_p None if all 0."""

    def col(values, dtype):
        return torch.tensor(values, dtype=dtype)

    args = [
        col(temperature, torch.float32),
        col(top_k, torch.int64),
        col(top_p, torch.float32),
        col(min_p, torch.float32) if any(min_p) else None,
    ]
    on_device = [None if a is None else a.to(DEVICE) for a in args]
    got = kernel.filter_thresholds(logits.to(DEVICE), *on_device, max(top_k), chunk=CHUNK)
    got = got.cpu().flatten()
    expected = keep_thresholds(logits.float(), *args, max(top_k), True).flatten()
    return got, expected


def check_kept(logits, got, cases) -> None:
    for row, case in enumerate(cases):
        kept = set(torch.nonzero(logits[row].float() >= got[row]).flatten().tolist())
        assert kept == kept_by_definition(logits[row].float().tolist(), *case), case


def test_thresholds_equal_the_torch_path_and_the_definition() -> None:
    # The filter tests' cases with a top_k within the first candidate width (the widest
    # candidates: below) on coarse values: many ties, some at the k-th; and a greedy row (its
    # thresholds as at temperature 1).
    gen = torch.Generator().manual_seed(0)
    narrow = kernel.CANDIDATE_WIDTHS[0]
    cases = [case for case in CASES if case[1] <= narrow] + [(0.0, 20, 0.8, 0.0)]
    logits = (torch.randn(len(cases), 100, generator=gen) * 12).round() / 4
    got, expected = both(logits, *(list(c) for c in zip(*cases, strict=True)))
    assert torch.equal(got, expected)
    check_kept(logits, got, cases)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_over_several_chunks(dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = ((torch.randn(4, 3 * CHUNK + 7, generator=gen) * 12).round() / 4).to(dtype)
    cases = [(0.7, 20, 0.8, 0.0), (1.0, 5, 0.99, 0.0), (0.5, 16, 1.0, 0.1), (1.0, 1, 0.5, 0.0)]
    got, expected = both(logits, *(list(c) for c in zip(*cases, strict=True)))
    assert torch.equal(got, expected)
    check_kept(logits, got, cases)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("group", [4, 8])
def test_grouped_stage_one_keeps_each_chunks_largest(group, dtype) -> None:
    # Stage 1 sorts only the groups with the largest maxima: chunks of 64 groups, the 32
    # candidates' groups picked. Row 0: coarse values (ties everywhere, negative ones too,
    # groups tied at the 32nd maximum); row 1: the top 40 values crowded into a few groups of
    # one chunk (a group holds several of the top 32); row 2: -inf tokens (banned) and a
    # vocabulary past the last full chunk; row 3: maxima a few float32 ulps apart (float32
    # groups are ranked by their whole maxima: 16-bit keys would tie them, the index decide).
    # group=chunk: the whole-chunk sort, the same thresholds.
    chunk = 64 * group
    gen = torch.Generator().manual_seed(4)
    vocab = 2 * chunk + 37
    logits = (torch.randn(4, vocab, generator=gen) * 12).round() / 4
    logits[1, 40:80] = 10.0 + torch.arange(40) / 8
    logits[2, ::3] = -torch.inf
    # Row 3: the first chunk's 64 group maxima 63..0 float32 ulps above 5.0, falling with
    # the group's index, every other token 4.0: the top 32 are groups 0-31's maxima.
    ulps = torch.tensor(5.0).view(torch.int32) + torch.arange(63, -1, -1, dtype=torch.int32)
    logits[3] = 4.0
    logits[3, :chunk:group] = ulps.view(torch.float32)
    logits = logits.to(dtype)
    assert kernel.group_width(chunk, 32, group) == group
    cases = [(0.7, 20, 0.8, 0.0), (1.0, 32, 0.95, 0.0), (0.5, 7, 1.0, 0.05), (1.0, 32, 1.0, 0.0)]
    temperature, top_k, top_p, min_p = (list(c) for c in zip(*cases, strict=True))
    args = [torch.tensor(temperature), torch.tensor(top_k), torch.tensor(top_p),
            torch.tensor(min_p)]  # fmt: skip
    got = kernel.filter_thresholds(logits.to(DEVICE), *(a.to(DEVICE) for a in args), 32,
                                   chunk=chunk, group=group).cpu().flatten()  # fmt: skip
    whole = kernel.filter_thresholds(logits.to(DEVICE), *(a.to(DEVICE) for a in args), 32,
                                     chunk=chunk, group=chunk).cpu().flatten()  # fmt: skip
    expected = keep_thresholds(logits.float(), *args, 32, True).flatten()
    assert torch.equal(got, expected) and torch.equal(whole, expected)
    check_kept(logits, got, cases)


def test_ties_past_every_chunks_candidates_share_the_mass() -> None:
    # 3 x CHUNK // 2 tokens tied for first over two chunks (more than a chunk's 16
    # candidates), top_k 2: top-k keeps them all; top_p 0.5 keeps them all too. With one
    # token above them, top_p 0.5 keeps the ties as well: their mass (counted past the
    # candidates) makes the top token's share e / (e + ties) < 0.5; the two candidates' alone
    # would give it 0.73 and keep it alone (threshold 4.0).
    logits = torch.full((3, 3 * CHUNK), -5.0)
    logits[:, CHUNK // 2 : 2 * CHUNK] = 3.0
    logits[2, 3] = 4.0
    got, expected = both(logits, [1.0] * 3, [2, 2, 2], [0.5, 1.0, 0.5], [0.0] * 3)
    assert torch.equal(got, expected)
    assert got.tolist() == [3.0, 3.0, 3.0]


def test_top_k_above_the_vocabulary_and_top_p_near_zero() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 40, generator=gen)
    got, expected = both(logits, [1.0, 0.5, 1.0], [200, 200, 7], [1.0, 0.3, 1e-30], [0.0, 0.1, 0])
    assert torch.equal(got, expected)
    assert got[0] == logits[0].min()  # every token kept
    assert got[2] == logits[2].max()  # the top token alone


def test_rows_without_top_k_keep_all_or_their_min_p() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 100, generator=gen)
    temperature = torch.tensor([1.0, 0.5], device=DEVICE)
    min_p = torch.tensor([0.0, 0.2], device=DEVICE)
    got = kernel.filter_thresholds(logits.to(DEVICE), temperature, None, None, min_p, 0, CHUNK)
    got = got.cpu()
    expected = keep_thresholds(logits, temperature.cpu(), None, None, min_p.cpu(), 0, True)
    assert torch.equal(got, expected)
    assert got[0, 0] == -torch.inf


def test_bad_arguments_are_clear_errors() -> None:
    logits = torch.zeros(1, 10, device=DEVICE)
    ones = torch.ones(1, device=DEVICE)
    with pytest.raises(ValueError, match="max_top_k"):
        kernel.filter_thresholds(logits, ones, None, None, None, kernel.MAX_TOP_K + 1)
    with pytest.raises(ValueError, match="top_p needs top_k"):
        kernel.filter_thresholds(logits, ones, None, ones, None, 0)
    with pytest.raises(ValueError, match="top_k has dtype"):
        kernel.filter_thresholds(logits, ones, ones, None, None, 1)
    with pytest.raises(ValueError, match="chunk must be a power of two"):
        kernel.filter_thresholds(logits, ones, None, None, None, 1, chunk=100)


def test_merge_stays_bounded_for_large_top_k_and_vocabularies() -> None:
    for vocab in (151_936, 248_320):
        for top_k in (1, 20, 64, kernel.MAX_TOP_K):
            chunk, kb, merge = kernel.merge_shape(vocab, top_k)
            assert kb >= top_k and chunk >= kb and merge <= kernel.MAX_MERGE
            assert merge >= -(-vocab // chunk) * kb
