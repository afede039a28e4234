"""Registers, spills and shared memory of the fused-MoE kernels on Hopper, without a GPU: each
kernel compiled for sm_90 through its launcher on meta tensors, with
benchmarks/kernels/kernel_resources.py's stub driver (nothing runs): the GEMMs in the tiles
`configs.py` gives a decode step (1 token) and a prefill step (8,192 tokens), the router,
alignment and sum, the small-step GEMVs at one token (bf16 and block FP8), at Qwen3-30B-A3B's
shapes (128 experts, top-8, hidden 2048, intermediate 768), bf16. One JSON line.

    python -m tests.kernels.moe_resources      (from the repository root)
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

from benchmarks.kernels.kernel_resources import _Capture, _StubDriver, meta, resources  # noqa: E402
from minivllm.kernels.moe import align, gemv, grouped_gemm, router, topk_sum  # noqa: E402
from minivllm.kernels.moe.align import ExpertBlocks, max_padded_rows  # noqa: E402
from minivllm.kernels.moe.configs import gemv_config, moe_config  # noqa: E402

E, H, INTER, TOP_K = 128, 2048, 768, 8
KEEP = ("n_regs", "n_spills", "spill_bytes", "shared", "ctas_per_sm", "num_warps", "sass_insts")


def compiled(module, name: str, launch) -> dict:
    kernel = getattr(module, name)
    capture = _Capture(kernel)
    setattr(module, name, capture)
    try:
        with redirect_stdout(io.StringIO()) as log:  # the ptxas log is printed
            launch()
    finally:
        setattr(module, name, kernel)
    every = resources(capture.compiled, log.getvalue())
    return {key: every[key] for key in KEEP}


def step(num_tokens: int) -> dict:
    config = moe_config(torch.bfloat16, (E, H, INTER, TOP_K), num_tokens)
    num_pairs = num_tokens * TOP_K
    rows = max_padded_rows(num_pairs, E, config.block_m)
    i32 = lambda n: meta(n, dtype=torch.int32)  # noqa: E731
    blocks = ExpertBlocks(i32(rows), i32(rows // config.block_m), i32(1), num_pairs, config.block_m)
    x, act = meta(num_tokens, H), meta(num_pairs, INTER)
    w13, w2 = meta(E, 2 * INTER, H), meta(E, H, INTER)
    weights = meta(num_pairs, dtype=torch.float32)
    name = "_grouped_gemm_kernel"
    return {
        "block_m": config.block_m,
        "gate_up": compiled(grouped_gemm, name, lambda: grouped_gemm.grouped_gemm(
            x, w13, blocks, config.gate_up, TOP_K, True)),
        "down": compiled(grouped_gemm, name, lambda: grouped_gemm.grouped_gemm(
            act, w2, blocks, config.down, 1, False, weights)),
    }  # fmt: skip


def gemv_step(fp8: bool) -> dict:
    """The two GEMV kernels of a one-token step (one launch runs both: both compile in it);
    block FP8's as a config names them (the rule keeps FP8 grouped)."""
    config = gemv_config(torch.bfloat16, fp8)
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    w13, w2 = meta(E, 2 * INTER, H, dtype=dtype), meta(E, H, INTER, dtype=dtype)
    f32 = torch.float32
    scales = (meta(E, 2 * INTER // 128, H // 128, dtype=f32),
              meta(E, H // 128, INTER // 128, dtype=f32)) if fp8 else None  # fmt: skip
    args = (meta(1, H), w13, w2, meta(1, TOP_K, dtype=f32), meta(1, TOP_K, dtype=torch.int32))
    names = {"gate_up": "_gate_up_gemv_kernel", "down": "_down_gemv_kernel"}
    kernels = {name: getattr(gemv, name) for name in names.values()}
    captures = {name: _Capture(kernel) for name, kernel in kernels.items()}
    vars(gemv).update(captures)
    try:
        with redirect_stdout(io.StringIO()) as log:  # the ptxas log is printed
            gemv.moe_gemv(*args, config, scales)
    finally:
        vars(gemv).update(kernels)
    figures = {part: resources(captures[name].compiled, log.getvalue())
               for part, name in names.items()}  # fmt: skip
    return {part: {key: every[key] for key in KEEP} for part, every in figures.items()}


def main() -> None:
    driver.set_active(_StubDriver())
    # These kernels' variants do not depend on the step (a second compile would be a cache hit).
    y, logits = meta(64 * TOP_K, H), meta(64, E)
    ids = meta(64, TOP_K, dtype=torch.int32)
    print(json.dumps({
        "decode": step(1), "prefill": step(8192),
        "gemv": gemv_step(False), "gemv_fp8": gemv_step(True),
        "topk_sum": compiled(topk_sum, "_topk_sum_kernel", lambda: topk_sum.topk_sum(y, TOP_K)),
        "router": compiled(router, "_topk_softmax_kernel",
                           lambda: router.topk_softmax(logits, TOP_K, True)),
        "align": compiled(align, "_align_kernel", lambda: align.align_by_expert(ids, E, 16)),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
