"""The e4m3 -> fp16 tile conversions of fp8 decode by inline PTX, opaque to Triton's compiler,
and the launcher checks that guard them (never in the interpreter, never on a CPU).

Two ways: `e4m3_to_f16_asm` is the hardware cvt (sm_89+); `e4m3_to_f16_scaled_asm` moves bits
instead (byte permutes, a shift and masks: integer ops at full rate) and returns x * 2**-8,
exactly, which the kernel folds into its scales (`BITS_SCALE`)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


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


# e4m3_to_f16_scaled_asm returns x / BITS_SCALE: e4m3's exponent bias is 7, fp16's 15.
BITS_SCALE = 256.0


@triton.jit
def e4m3_to_f16_scaled_asm(x):
    """x * 2**-8 as fp16, exactly (subnormals included; e4m3's NaN is not stored by store_kv).
    An e4m3 byte s.eeee.mmm placed in the high byte of a 16-bit half and shifted right by one
    is the fp16 s.0eeee.mmm0000000 = 2**(e - 15) * (1 + m / 8): the e4m3 value times 2**-8
    (a zero exponent gives the fp16 subnormal m * 2**-17, also 2**-8 times e4m3's). prmt puts
    bytes 0, 1 (then 2, 3) of $2 into the high bytes of the two halves of a word; the sign bit
    is kept from there, exponent and mantissa are taken from the word shifted right by one.
    Element order as in e4m3_to_f16_asm: byte i of $2 is element i, $0 holds elements 0-1."""
    return tl.inline_asm_elementwise(
        "{.reg .b32 z, a, b, t; mov.b32 z, 0; "
        "prmt.b32 a, $2, z, 0x1404; prmt.b32 b, $2, z, 0x3424; "
        "shr.b32 t, a, 1; and.b32 t, t, 0x3F803F80; and.b32 a, a, 0x80008000; "
        "or.b32 $0, a, t; "
        "shr.b32 t, b, 1; and.b32 t, t, 0x3F803F80; and.b32 b, b, 0x80008000; "
        "or.b32 $1, b, t;}",
        "=r,=r,r",
        [x.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=False,  # converted where loaded, as e4m3_to_f16_asm
        pack=4,
    )


def e4m3_asm_unsupported(q: torch.Tensor, is_fp8: bool) -> str | None:
    """Why e4m3_to_f16_asm cannot run for this launch, or None where it can: CUDA (not
    TRITON_INTERPRET=1), sm_89 or newer, an fp8 cache and a 16-bit q."""
    if os.environ.get("TRITON_INTERPRET") == "1" or q.device.type != "cuda":
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
        raise ValueError(f"{option} {reason}")
