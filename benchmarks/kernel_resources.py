"""Registers, spills and shared memory of the attention kernels on Hopper, without a GPU: each
kernel is compiled for sm_90 by its own launcher (the `long` workload's shapes: Qwen3-0.6B,
bf16, head_dim 128, 16 q / 8 kv heads, 16k-token prefills, 16 decodes of 16k keys, block 16),
on meta tensors, with Triton's driver replaced by a stub that names the target; nothing runs.
Figures per variant: n_regs (per thread), n_spills (local memory words per thread, as Triton's
`n_spills`), spill_insts (STL/LDL in the SASS), sass_insts, shared bytes, ctas_per_sm (what
registers, shared memory and warps allow on one H100/H200 SM). One JSON line.

    python benchmarks/kernel_resources.py [--only bi_walk,prefill]

Triton's version is in the output: the compiler, not the GPU, decides these numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

import minivllm.kernels.batch_invariant_attention as bi
import minivllm.kernels.decode_attention as dec
import minivllm.kernels.prefill_attention as pre
from minivllm.kernels.attention_segments import SEGMENTS

TARGET = GPUTarget("cuda", 90, 32)
SM_REGS, SM_SMEM, SM_WARPS = 65536, 228 * 1024, 64  # per SM, H100/H200
ROWS, SEQS, CTX = 16384, 16, 16384  # a prefill chunk; the decode batch and its contexts
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16


class _StubDriver:
    """What JITFunction.warmup asks of a driver before it compiles."""

    def get_current_target(self):
        return TARGET

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


class _Capture:
    """Stands in for a kernel in its module: `kernel[grid](...)` compiles, keeps the result."""

    def __init__(self, kernel):
        self.kernel, self.compiled = kernel, None

    def __getitem__(self, grid):
        def warmup(*args, **kwargs):
            self.compiled = self.kernel.warmup(*args, grid=grid, **kwargs)

        return warmup


def compile_launch(module, name: str, launch):
    """The CompiledKernel of module.<name> as launch() would launch it (the first launch)."""
    capture = _Capture(getattr(module, name))
    setattr(module, name, capture)
    try:
        launch()
    finally:
        setattr(module, name, capture.kernel)
    return capture.compiled


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def inputs(rows: int, seqs: int, ctx: int) -> dict:
    """Launcher arguments for `seqs` requests whose `rows` query tokens end a context of ctx."""
    blocks = triton.cdiv(ctx, BLOCK_SIZE)
    return {
        "q": meta(rows, HEADS, HEAD_DIM),
        "kv_cache": meta(2, seqs * blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM),
        "query_start_loc": meta(seqs + 1, dtype=torch.int32),
        "seq_lens": meta(seqs, dtype=torch.int32),
        "block_tables": meta(seqs, blocks, dtype=torch.int32),
        "scale": HEAD_DIM**-0.5,
        "out": meta(rows, HEADS, HEAD_DIM),
    }


def bi_prefill(config=None):
    """The varlen walk (SPLIT=False, DECODE=False) on a prefill chunk; config: an override."""
    return lambda: bi.batch_invariant_attention(**inputs(ROWS, 1, CTX), config=config)


def bi_split_decode():
    """The split launch (SPLIT=True, DECODE=True) of the decode batch, as the engine picks it."""
    segs = SEGMENTS.max_count(CTX)
    part_acc = meta(SEQS, HEADS, segs, HEAD_DIM, dtype=torch.float32)
    part_ml = meta(SEQS, HEADS, segs, dtype=torch.float32)
    return lambda: bi.batch_invariant_attention(
        **inputs(SEQS, SEQS, CTX), num_segments=segs, part_acc=part_acc, part_m=part_ml,
        part_l=part_ml, decode_rows=True,
    )  # fmt: skip


def decode_launch():
    args = inputs(SEQS, SEQS, CTX)
    args.pop("query_start_loc")
    splits = dec.choose_num_splits(SEQS, KV_HEADS, CTX, num_sms=132)
    mid_o = meta(SEQS, HEADS, splits, HEAD_DIM, dtype=torch.float32)
    mid_lse = meta(SEQS, HEADS, splits, dtype=torch.float32)
    order = meta(SEQS, dtype=torch.int32)
    return lambda: dec.decode_attention(**args, num_splits=splits, mid_o=mid_o, mid_lse=mid_lse,
                                        order=order)  # fmt: skip


BI_PREFILL = bi.batch_invariant_config(HEAD_DIM, 2)
# name -> (module, kernel, launch)
VARIANTS = {
    "prefill": (pre, "_prefill_kernel", lambda: pre.prefill_attention(**inputs(ROWS, 1, CTX))),
    "bi_walk": (bi, "_bi_attention_kernel", bi_prefill()),
    "bi_walk_m64": (bi, "_bi_attention_kernel", bi_prefill((64, *BI_PREFILL[1:]))),
    "bi_walk_s2": (bi, "_bi_attention_kernel", bi_prefill((*BI_PREFILL[:3], 2))),
    "bi_split_decode": (bi, "_bi_attention_kernel", bi_split_decode()),
    "decode": (dec, "_decode_kernel", decode_launch()),
}


def resources(kernel) -> dict:
    """Figures of a CompiledKernel, from its cubin (cuobjdump) and Triton's metadata."""
    md = kernel.metadata
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        cuobjdump = knobs.nvidia.cuobjdump.path
        usage = subprocess.check_output([cuobjdump, "-res-usage", f.name], text=True)
        sass = subprocess.check_output([cuobjdump, "-sass", f.name], text=True)
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    insts = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    warp_regs = -(-regs * 32 // 256) * 256  # allocated per warp in units of 256
    ctas = min(
        SM_REGS // warp_regs // md.num_warps,
        SM_SMEM // (md.shared + 1024),  # 1 KB per CTA is reserved
        SM_WARPS // md.num_warps,
    )
    consts = kernel.src.constants
    names = kernel.src.fn.arg_names
    blocks = {names[k[0]]: v for k, v in consts.items() if names[k[0]].startswith("BLOCK_")}
    return {
        "n_regs": regs,
        "n_spills": stack // 4,
        "spill_insts": sum(i.startswith(("STL", "LDL")) for i in insts),
        "sass_insts": len(insts),
        "shared": md.shared,
        "ctas_per_sm": ctas,
        "num_warps": md.num_warps,
        "num_stages": md.num_stages,
        **blocks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    args = parser.parse_args()
    driver.set_active(_StubDriver())
    result = {"triton": triton.__version__, "target": f"sm_{TARGET.arch}"}
    for name in args.only.split(","):
        module, kernel, launch = VARIANTS[name]
        result[name] = resources(compile_launch(module, kernel, launch))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
