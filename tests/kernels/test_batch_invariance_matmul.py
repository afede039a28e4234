"""matmul (batch-invariant GEMM): equals F.linear within rounding, and a row's bits do not
depend on how many rows are computed with it or where it sits among them, also when the tile
config switches between M buckets (kernels/matmul_configs.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ordered_dot import ordered_dot  # noqa: F401 (fixture)
from paged_case import DEVICE

from minivllm.kernels import matmul_configs
from minivllm.kernels.matmul import matmul
from minivllm.kernels.matmul_configs import check_buckets, matmul_config

CONFIG = (16, 16, 16, 4, 1)  # small tiles: several row, column and k tiles in the interpreter
# M buckets with other row / column tiles and warps, one BLOCK_K: M <= 8, <= 40, larger.
BUCKETS = ((8, (16, 16, 16, 4, 1)), (40, (32, 16, 16, 2, 1)), (64, (64, 32, 16, 4, 2)))


def _data(m: int, k: int, n: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE)
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,k,n", [(1, 48, 40), (37, 40, 33), (0, 16, 16)])
def test_matches_linear(dtype, m, k, n):
    x, w, b = _data(m, k, n, dtype)
    for bias in (None, b):
        got = matmul(x, w, bias, config=CONFIG)
        expected = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)
        assert got.dtype == dtype and got.shape == (m, n)


def test_default_config():
    x, w, b = _data(3, 64, 40, torch.float32)
    torch.testing.assert_close(matmul(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_leading_dims_and_strided_rows():
    x, w, _ = _data(12, 32, 24, torch.float32)
    got = matmul(x.view(3, 4, 32), w, config=CONFIG)
    torch.testing.assert_close(got, F.linear(x, w).view(3, 4, 24))
    wide = torch.randn(12, 64, device=DEVICE)
    torch.testing.assert_close(matmul(wide[:, :32], w, config=CONFIG), F.linear(wide[:, :32], w))


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("k", [64, 40])  # whole k tiles, and a masked last one
def test_row_bits_independent_of_batch(dtype, k):
    x, w, b = _data(128, k, 40, dtype, seed=1)
    row = x[77]
    alone = matmul(row[None], w, b, config=CONFIG)[0]
    for m, at in ((37, 20), (128, 77), (16, 15)):
        batch = x[:m].clone()
        batch[at] = row
        got = matmul(batch, w, b, config=CONFIG)
        assert torch.equal(got[at], alone), f"M={m}, row {at}"


def test_bad_input():
    x, w, _ = _data(2, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="in_features"):
        matmul(x, w[:, :8])
    with pytest.raises(ValueError, match="dtype"):
        matmul(x.half(), w)
    with pytest.raises(ValueError, match="bias length"):
        matmul(x, w, torch.zeros(3, device=DEVICE))


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_row_bits_across_m_buckets(dtype):
    x, w, b = _data(100, 40, 40, dtype, seed=2)  # k 40: a masked last k tile
    full = matmul(x, w, b, buckets=BUCKETS)  # M 100: past the last bound, its config
    torch.testing.assert_close(full.float(), F.linear(x.float(), w.float(), b.float()),
                               atol=2e-3, rtol=2e-3)  # fmt: skip
    for m in (1, 8, 9, 40, 41, 64):
        assert torch.equal(matmul(x[:m], w, b, buckets=BUCKETS), full[:m]), f"M={m}"
    assert torch.equal(matmul(x[99:], w, b, buckets=BUCKETS)[0], full[99])


def test_config_table(monkeypatch):
    for buckets in matmul_configs.TABLE.values():  # what the tuning script pasted
        check_buckets(buckets)
    monkeypatch.setitem(matmul_configs.TABLE, (40, 24), BUCKETS)
    assert matmul_config(torch.bfloat16, 40, 24, 1) == BUCKETS[0][1]
    assert matmul_config(torch.float16, 40, 24, 9) == BUCKETS[1][1]
    assert matmul_config(torch.bfloat16, 40, 24, 10**6) == BUCKETS[2][1]
    # Other shapes and float32 take the rule, whatever M is.
    rule = matmul_config(torch.float32, 40, 24, 1)
    assert matmul_config(torch.float32, 40, 24, 10**6) == rule
    assert matmul_config(torch.bfloat16, 48, 24, 1) == matmul_config(torch.bfloat16, 48, 24, 10**6)
    x, w, _ = _data(9, 24, 40, torch.float16)
    torch.testing.assert_close(matmul(x, w).float(), F.linear(x.float(), w.float()),
                               atol=2e-3, rtol=2e-3)  # fmt: skip


def test_bad_buckets():
    x, w, _ = _data(2, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="block_k"):
        matmul(x, w, buckets=((1, (16, 16, 16, 4, 1)), (8, (16, 16, 32, 4, 1))))
    with pytest.raises(ValueError, match="ascending"):
        matmul(x, w, buckets=((8, CONFIG), (1, CONFIG)))
    with pytest.raises(ValueError, match="at least one"):
        matmul(x, w, buckets=())
