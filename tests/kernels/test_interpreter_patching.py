"""tests/interpreter_patching.py shortens only the interpreter's bookkeeping: the integer
overflow checks it turns off are ones the interpreter computes and drops (no debug: no
assert), and a kernel of integer arithmetic in nested jit calls computes the same bits with
them and without them."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.errors import InterpreterError

from tests.interpreter_patching import skip_dropped_overflow_checks

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter (CPU) only"
)


@triton.jit
def _scaled(x, k):
    return x * k + 7


@triton.jit
def _int_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, _scaled(x, 3) - offs, mask=mask)  # int32 mul, add, sub


def _run(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _int_kernel[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
    return out


@pytest.fixture
def builder(monkeypatch: pytest.MonkeyPatch):
    """The interpreter's builder, its options restored after the test."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", builder.options)
    return builder


def _set(builder, **options) -> None:
    builder.options = dataclasses.replace(builder.options, **options)


def test_installed_the_checks_are_off_and_would_be_dropped(builder) -> None:
    assert builder.options.debug is False and builder.options.sanitize_overflow is False
    _set(builder, sanitize_overflow=True)
    big = torch.full((20,), 2**30, dtype=torch.int32)
    _run(big)  # an int32 overflow, checked and dropped without debug: no error
    _set(builder, debug=True)
    with pytest.raises(InterpreterError, match="int32 overflow detected"):
        _run(big)  # with debug the same check asserts


def test_the_checks_stay_on_under_debug(builder) -> None:
    from triton.runtime import interpreter

    _set(builder, debug=True, sanitize_overflow=True)
    skip_dropped_overflow_checks(interpreter)
    assert builder.options.sanitize_overflow is True
    _set(builder, debug=False)
    skip_dropped_overflow_checks(interpreter)
    assert builder.options.sanitize_overflow is False


def test_same_bits_with_and_without_the_checks(builder) -> None:
    x = torch.arange(-20, 21, dtype=torch.int32) * 1000
    without = _run(x)
    _set(builder, sanitize_overflow=True)
    assert torch.equal(_run(x), without)
    assert torch.equal(without, x * 3 + 7 - torch.arange(41, dtype=torch.int32))
