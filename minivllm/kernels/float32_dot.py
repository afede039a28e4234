"""The attention kernels' tile products: float32 operands as exact float32 products.

On the GPU `tl.dot` rounds float32 operands to tf32 (10 mantissa bits) by default: ~3 decimal
digits, enough to flip a tiny float32 model's near-tied argmax against transformers' float32.
A float32 engine asks for float32 arithmetic, as the GEMMs give it (kernels/matmul.py);
16-bit operands are unaffected.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot(a, b):
    """a @ b with a float32 accumulator; IEEE products where a is float32."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)
