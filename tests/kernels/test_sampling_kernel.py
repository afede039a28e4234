"""Fused plain sampling: greedy vs torch.argmax, draws keyed by (seed, offset), distribution."""

from __future__ import annotations

import pytest
import torch
from paged_case import DEVICE

from minivllm.kernels.sampling import sample_plain

DTYPES = [torch.float32, torch.float16]
DRAW = 1 << 32  # the offset stride SamplingState uses between draws


def run(logits, temperature, seeds, offsets, **kwargs) -> list[int]:
    """sample_plain on DEVICE with list arguments; returns the token ids as a list."""
    n = logits.shape[0]

    def col(values, dtype):
        values = values if isinstance(values, list) else [values] * n
        return torch.tensor(values, dtype=dtype, device=DEVICE)

    out = sample_plain(
        logits.to(DEVICE),
        col(temperature, torch.float32),
        col(seeds, torch.int64),
        col(offsets, torch.int64),
        **kwargs,
    )
    assert out.dtype == torch.int64 and out.shape == (n,)
    return out.tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_rows_equal_argmax(dtype):
    torch.manual_seed(0)
    wide = torch.randn(6, 3100) * 4
    wide[1, 5] = wide[1, 2000] = 50.0  # a tie across chunks
    wide[2, 1030] = wide[2, 1100] = 50.0  # a tie inside one chunk
    wide[3, 2999] = 50.0  # the last id of a partial chunk
    logits = wide[:, :3000].to(dtype)  # strided rows
    tokens = run(logits, 0.0, 1, 0, block=1024)
    assert tokens == logits.float().argmax(-1).tolist()
    assert tokens[1:4] == [5, 1030, 2999]


def test_mixed_batch_keeps_greedy_rows_exact():
    torch.manual_seed(1)
    logits = torch.randn(5, 1500)
    temperature = [0.0, 1.0, 0.0, 0.7, 0.0]
    tokens = run(logits, temperature, [4, 4, 4, 4, 4], [0, 0, DRAW, DRAW, 2 * DRAW], block=512)
    argmax = logits.argmax(-1).tolist()
    assert [tokens[i] for i in (0, 2, 4)] == [argmax[i] for i in (0, 2, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_draw_depends_only_on_seed_and_offset(dtype):
    torch.manual_seed(2)
    row = torch.randn(1, 2000).to(dtype)
    keys = [(3, 0), (9, 0), (3, DRAW), (-5, 7 * DRAW)]
    alone = [run(row, 1.0, seed, offset)[0] for seed, offset in keys]
    # Reordered, mixed with other rows and greedy rows, and with another chunk size.
    batch_keys = [(11, 0), keys[3], keys[1], (0, 0), keys[0], keys[2]]
    batch = run(
        row.repeat(6, 1),
        [1.0, 1.0, 1.0, 0.0, 1.0, 1.0],
        [s for s, _ in batch_keys],
        [o for _, o in batch_keys],
        block=256,
    )
    assert [batch[4], batch[2], batch[5], batch[1]] == alone
    assert run(row.repeat(4, 1), 1.0, [s for s, _ in keys], [o for _, o in keys]) == alone


def test_different_seeds_and_offsets_differ():
    uniform = torch.zeros(8, 2000)
    by_seed = run(uniform, 1.0, list(range(8)), 0)
    by_offset = run(uniform, 1.0, 7, [i * DRAW for i in range(8)])
    assert len(set(by_seed)) == 8 and len(set(by_offset)) == 8


def chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    expected = probs.double() * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


def test_distribution_matches_softmax_with_temperature():
    logits_row = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2, 0.0, -0.2, -0.4])
    num_draws = 300
    temperatures = [1.0] * num_draws + [0.5] * num_draws
    offsets = [i * DRAW for i in range(2 * num_draws)]
    tokens = run(logits_row.repeat(2 * num_draws, 1), temperatures, 123, offsets)
    hot, cold = tokens[:num_draws], tokens[num_draws:]
    # 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    assert chi_square(hot, logits_row.softmax(-1)) < 24.3
    assert chi_square(cold, (logits_row / 0.5).softmax(-1)) < 24.3
    # The bound is tight enough to tell the two temperatures apart.
    assert chi_square(cold, logits_row.softmax(-1)) > 24.3
    assert chi_square(hot, (logits_row / 0.5).softmax(-1)) > 24.3


def test_masked_tokens_are_never_drawn_and_draws_repeat():
    logits = torch.full((16, 600), -torch.inf)
    logits[:, 17] = 0.0
    logits[:, 590] = 0.5
    offsets = [i * DRAW for i in range(16)]
    tokens = run(logits, 2.0, 5, offsets, block=256)
    assert set(tokens) == {17, 590}
    assert run(logits, 2.0, 5, offsets, block=256) == tokens


def test_empty_batch_and_out_buffer():
    assert run(torch.zeros(0, 100), [], [], []) == []
    out = torch.full((2,), -1, dtype=torch.int64, device=DEVICE)
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]], device=DEVICE)
    zeros = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    result = sample_plain(logits, torch.zeros(2, device=DEVICE), zeros, zeros, out=out)
    assert result is out and out.tolist() == [1, 0]


def test_bad_inputs_raise_value_error():
    logits = torch.zeros(2, 100, device=DEVICE)
    t = torch.ones(2, device=DEVICE)
    ids = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    bad_calls = [
        (logits.double(), t, ids, ids),
        (logits, t.double(), ids, ids),
        (logits, t, ids.int(), ids),
        (logits, t, ids, ids[:1]),
        (logits.t(), t, ids, ids),
        (logits[0], t, ids, ids),
    ]
    for args in bad_calls:
        with pytest.raises(ValueError):
            sample_plain(*args)
    with pytest.raises(ValueError, match="power of two"):
        sample_plain(logits, t, ids, ids, block=100)
    with pytest.raises(ValueError, match="out"):
        sample_plain(logits, t, ids, ids, out=torch.empty(3, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
def test_thresholds_draw_as_the_masked_logits_do(dtype):
    # A row's threshold drops its logits below it in the same pass: the same token as the
    # plain draw over logits with those set to -inf, greedy rows (argmax of what stays) too.
    torch.manual_seed(3)
    logits = (torch.randn(5, 700) * 3).to(dtype).to(DEVICE)
    thresholds = torch.tensor([[-torch.inf], [2.0], [4.0], [1.0], [3.0]], device=DEVICE)
    temperature = torch.tensor([0.7, 1.0, 0.0, 1.3, 0.5], device=DEVICE)
    seeds = torch.tensor([1, 2, 3, 4, 5], device=DEVICE)
    offsets = torch.arange(5, device=DEVICE) * DRAW
    masked = logits.masked_fill(logits.float() < thresholds, -torch.inf)
    expected = sample_plain(masked, temperature, seeds, offsets, block=128)
    got = sample_plain(logits, temperature, seeds, offsets, block=128, thresholds=thresholds)
    assert got.tolist() == expected.tolist()
    kept = logits.float().gather(1, got.unsqueeze(1))
    assert (kept >= thresholds).all()
    # Greedy row 2's argmax stays itself under its threshold; a threshold above every logit
    # but the top leaves only the top.
    top = logits.float().max(dim=1, keepdim=True).values
    only_top = sample_plain(logits, temperature, seeds, offsets, thresholds=top)
    assert only_top.tolist() == logits.float().argmax(dim=1).tolist()
