"""The interpreter's tl.dot is numpy's BLAS matmul, whose rounding for a row can depend on where
the row sits in the tile (edge kernels); a GPU MMA computes every output element by the same
chain of k-steps. Batch-invariance tests swap in that per-element chain."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def _ordered_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    from triton.runtime.interpreter import TensorHandle

    dtype = d.data.dtype
    a_data, b_data = a.data.astype(dtype), b.data.astype(dtype)
    # [M, K, N] products reduced over k: the same order for every (i, j), wherever i sits.
    products = a_data[..., :, :, None] * b_data[..., None, :, :]
    return TensorHandle(d.data + products.sum(axis=-2), d.dtype.scalar)


def install() -> None:
    """The ordered dot for the rest of this process (a worker process's start-up)."""
    from triton.runtime.interpreter import InterpreterBuilder

    InterpreterBuilder.create_dot = _ordered_dot


@pytest.fixture
def ordered_dot_in_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ordered dot in the engine's worker processes too (tensor-parallel ranks > 0 run in
    subprocesses that inherit the environment): a sitecustomize on their PYTHONPATH installs
    it when they start, and the interpreter's shortened patching (tests/conftest.py's)."""
    if torch.cuda.is_available():
        return
    site = tmp_path / "ordered_dot_site"
    site.mkdir()
    here = Path(__file__).parent
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(here)!r})\nsys.path.append({str(here.parent)!r})\n"
        "import ordered_dot\nordered_dot.install()\n"
        "import interpreter_patching\ninterpreter_patching.install()\n"
    )
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), path) if p))


@pytest.fixture
def ordered_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        return  # real MMAs
    from triton.runtime.interpreter import InterpreterBuilder

    monkeypatch.setattr(InterpreterBuilder, "create_dot", _ordered_dot)
