"""Registers, spills and shared memory of the gated delta kernels on Hopper, without a GPU: each
kernel compiled for sm_90 through its own launcher on meta tensors, with
benchmarks/kernels/kernel_resources.py's stub driver (nothing runs). Shapes: Qwen3.5-9B's linear
attention (16 q/k heads, 32 value heads, head dims 128, conv over 8,192 channels), bf16, an
8,192-token prefill of 4 sequences, a decode batch of 64. One JSON line.

    python -m tests.kernels.gated_delta_resources      (from the repository root)
"""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
os.environ.update(TRITON_ALWAYS_COMPILE="1", TRITON_DUMP_PTXAS_LOG="1")
import torch  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from benchmarks.kernels.kernel_resources import _Capture, _StubDriver, meta, resources  # noqa: E402
from minivllm.kernels.gated_delta import conv1d, decode, prefill  # noqa: E402
from minivllm.kernels.gated_delta.chunk_layout import CHUNK_SIZE, ChunkLayout  # noqa: E402

TOKENS, SEQS, DECODES, SLOTS = 8192, 4, 64, 64
H_K, H_V, D = 16, 32, 128
KEEP = ("n_regs", "n_spills", "spill_bytes", "shared", "ctas_per_sm", "num_warps", "sass_insts")


def compile_all(module, launch) -> dict:
    """Every `*_kernel` of module that launch() launches, compiled: name -> figures."""
    kernels = {k: v for k, v in vars(module).items() if k.endswith("_kernel")}
    kernels = {k: v for k, v in kernels.items() if isinstance(v, JITFunction)}
    captures = {k: _Capture(v) for k, v in kernels.items()}
    vars(module).update(captures)
    try:
        with redirect_stdout(io.StringIO()) as log:  # the ptxas log is printed
            launch()
    finally:
        vars(module).update(kernels)
    figures = {}
    for name, capture in captures.items():
        if capture.compiled is not None:
            every = resources(capture.compiled, log.getvalue())
            figures[name] = {key: every[key] for key in KEEP}
    return figures


def main() -> None:
    driver.set_active(_StubDriver())
    i32 = lambda n: meta(n, dtype=torch.int32)  # noqa: E731
    layout = ChunkLayout(i32((TOKENS // CHUNK_SIZE) * 2).view(-1, 2), i32(SEQS + 1))
    channels = (2 * H_K + H_V) * D
    qkv = meta(TOKENS, channels)
    q = qkv[:, : H_K * D].view(TOKENS, H_K, D)
    k = qkv[:, H_K * D : 2 * H_K * D].view(TOKENS, H_K, D)
    v = qkv[:, 2 * H_K * D :].view(TOKENS, H_V, D)
    g, beta = meta(TOKENS, H_V, dtype=torch.float32), meta(TOKENS, H_V)
    state = meta(SLOTS, H_V, D, D, dtype=torch.float32)
    has_init = meta(SEQS, dtype=torch.bool)
    weight, conv_state = meta(channels, 4), meta(SLOTS, 3, channels)
    n = DECODES
    figures = {
        **compile_all(prefill, lambda: prefill.gated_delta_rule_prefill(
            q, k, v, g, beta, i32(SEQS + 1), state, i32(SEQS), has_init, use_qk_l2norm=True,
            layout=layout,
        )),
        **compile_all(decode, lambda: decode.gated_delta_rule_decode(
            q[:n], k[:n], v[:n], g[:n], beta[:n], state, i32(n), use_qk_l2norm=True
        )),
        **compile_all(conv1d, lambda: conv1d.causal_conv1d_prefill(
            qkv, weight, None, i32(SEQS + 1), conv_state, i32(SEQS), has_init, layout=layout
        )),
        **compile_all(conv1d, lambda: conv1d.causal_conv1d_update(
            qkv[:n], weight, None, conv_state, i32(n)
        )),
    }  # fmt: skip
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
