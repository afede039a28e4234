"""The e4m3 -> fp16 tile conversion of fp8 decode by inline PTX (sm_89+), opaque to Triton's
compiler, and the launcher checks that guard it (never in the interpreter, never on a CPU)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import runs_inline_ptx


@triton.jit
def e4m3_to_f16_asm(x):
    """The cvt `x.to(tl.float16)` emits, made opaque. A plain cast of decode's V tile is moved
    past its shared-memory read into the MMA operand layout (there is no 8-bit transposed
    ldmatrix): byte-wide shared loads and a cvt per element pair inside the loop. An impure asm
    stays where it is written, so the tile is converted as loaded, stored as fp16 and read back
    by ldmatrix.trans. Element order, pack=4: byte i of $2 is element i; lo = bytes 0-1 gives $0
    (elements 0, 1), hi gives $1 (2, 3), and cvt puts a pair's upper byte in the upper half."""
    return tl.inline_asm_elementwise(
        "{.reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
        "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi;}",
        "=r,=r,r",
        [x.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=False,  # a pure asm is moved like the cast
        pack=4,
    )


def e4m3_asm_unsupported(q: torch.Tensor, is_fp8: bool) -> str | None:
    """Why e4m3_to_f16_asm cannot run for this launch, or None where it can: CUDA (not
    TRITON_INTERPRET=1), sm_89 or newer, an fp8 cache and a 16-bit q."""
    if not runs_inline_ptx(q):
        return "is inline PTX: CUDA only, not under TRITON_INTERPRET=1"
    if not is_fp8:
        return "needs a float8_e4m3fn kv_cache"
    if q.dtype == torch.float32:
        return "needs a float16 or bfloat16 q (the tiles become fp16)"
    if _capability(q.device) < (8, 9):
        return "needs sm_89 or newer (cvt.rn.f16x2.e4m3x2)"
    return None


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)  # once per device: launches ask every step


def check_e4m3_asm(option: str, q: torch.Tensor, is_fp8: bool) -> None:
    """Raises a ValueError naming `option` unless e4m3_to_f16_asm can run for this launch."""
    reason = e4m3_asm_unsupported(q, is_fp8)
    if reason is not None:
        raise ValueError(f"{option}=True {reason}")
