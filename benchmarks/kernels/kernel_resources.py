"""Registers, spills and shared memory of the attention kernels on Hopper, without a GPU (~30 s
on 2 cores). Each kernel is compiled for sm_90 through its own launcher, on meta tensors, with
Triton's driver replaced by a stub that only names the target: nothing runs. Shapes are the
`long` workload's: Qwen3-0.6B (16 q / 8 kv heads, head_dim 128), bf16, KV blocks of 16, a
16,384-row prefill chunk, a decode batch of 16 rows with 16,384-key contexts.

Per variant: n_regs (per thread), n_spills (local memory words per thread, Triton's n_spills),
spill_bytes (ptxas's spill stores + loads), perf_loss (ptxas's "Potential Performance Loss"
note, e.g. C7515: wgmma serialized), sass_insts, shared (bytes), ctas_per_sm on an H100/H200
SM (0: more shared memory than a block may have, the launch fails), the BLOCK_* constexprs,
num_warps, num_stages. One JSON line.

    python -m benchmarks.kernels.kernel_resources [--only bi_walk,prefill]
    PYTHONPATH=TRITON36_SITE python -m benchmarks.kernels.kernel_resources \
        --only gluon_prefill,gluon_bi_prefill

The numbers are the compiler's (Triton and its ptxas), in the output as "triton".
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import tempfile
from contextlib import redirect_stdout

import torch

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # 3.9 warns when unset; 3.6's default
os.environ.update(TRITON_ALWAYS_COMPILE="1", TRITON_DUMP_PTXAS_LOG="1")  # ptxas's log, always
import triton  # noqa: E402
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

import minivllm.kernels.batch_invariant_attention as bi
import minivllm.kernels.decode_attention as dec
import minivllm.kernels.prefill_attention as pre
from minivllm.kernels.attention_segments import SEGMENTS

TARGET = GPUTarget("cuda", 90, 32)
SM_REGS, SM_SMEM, SM_WARPS = 65536, 228 * 1024, 64  # per SM, H100/H200
BLOCK_SMEM = 227 * 1024  # the most shared memory one block may opt in to
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
    """The CompiledKernel of module.<name> as launch() would launch it; the module's other
    `*_kernel`s (a split launch's reduce) are compiled too, not reported."""
    kernels = {k: v for k, v in vars(module).items() if k.endswith("_kernel")}
    kernels = {k: v for k, v in kernels.items() if isinstance(v, JITFunction)}
    captures = {k: _Capture(v) for k, v in kernels.items()}
    vars(module).update(captures)
    try:
        launch()
    finally:
        vars(module).update(kernels)
    return captures[name].compiled


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


def bi_walk_decode():
    """The decode batch walked (SPLIT=False, DECODE=True): decode tiles, one program per row."""
    return lambda: bi.batch_invariant_attention(**inputs(SEQS, SEQS, CTX), decode_rows=True)


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
    """The default decode kernel on the decode batch, split as the triton backend splits it."""
    args = inputs(SEQS, SEQS, CTX)
    args.pop("query_start_loc")
    splits = dec.choose_num_splits(SEQS, KV_HEADS, CTX, num_sms=132)
    mid_o = meta(SEQS, HEADS, splits, HEAD_DIM, dtype=torch.float32)
    mid_lse = meta(SEQS, HEADS, splits, dtype=torch.float32)
    scratch = {"mid_o": mid_o, "mid_lse": mid_lse, "order": meta(SEQS, dtype=torch.int32)}
    return lambda: dec.decode_attention(**args, num_splits=splits, **scratch)


def gluon_launch(module_name: str, launcher: str):
    """A Gluon kernel's launcher on the prefill chunk. It builds TMA descriptors from data
    pointers (CPU tensors stand in) and checks for a Hopper GPU, which a compile without one
    has to skip: the FA3-style module's `supports` says yes here."""
    import importlib

    import minivllm.kernels.gluon_prefill_attention as fa3

    module = importlib.import_module(f"minivllm.kernels.{module_name}")

    def launch():
        blocks = triton.cdiv(CTX, BLOCK_SIZE)
        args = {k: torch.empty_like(v, device="cpu") if isinstance(v, torch.Tensor) else v
                for k, v in inputs(ROWS, 1, CTX).items()}  # fmt: skip
        args["query_start_loc"] = torch.tensor([0, ROWS], dtype=torch.int32)
        args["seq_lens"] = torch.tensor([CTX], dtype=torch.int32)
        args["block_tables"] = torch.arange(blocks, dtype=torch.int32)[None]
        supports, fa3.supports = fa3.supports, lambda q, kv_cache: True
        try:
            getattr(module, launcher)(**args, kv_head_major=True)  # no device to ask
        finally:
            fa3.supports = supports

    return module, launch


BI_PREFILL = bi.batch_invariant_config(HEAD_DIM, 2)
# name -> (module, kernel, launch)
VARIANTS = {
    "prefill": (pre, "_prefill_kernel", lambda: pre.prefill_attention(**inputs(ROWS, 1, CTX))),
    "bi_walk": (bi, "_bi_attention_kernel", bi_prefill()),
    "bi_walk_m64": (bi, "_bi_attention_kernel", bi_prefill((64, *BI_PREFILL[1:]))),
    "bi_walk_s2": (bi, "_bi_attention_kernel", bi_prefill((*BI_PREFILL[:3], 2))),
    "bi_walk_decode": (bi, "_bi_attention_kernel", bi_walk_decode()),
    "bi_split_decode": (bi, "_bi_attention_kernel", bi_split_decode()),
    "decode": (dec, "_decode_kernel", decode_launch()),
}
# Compiled only when asked for (--only gluon_prefill): written against triton 3.6's Gluon.
OPTIONAL = {
    "gluon_prefill": (
        "_gluon_prefill_kernel",
        lambda: gluon_launch("gluon_prefill_attention", "gluon_prefill_attention"),
    ),
    "gluon_bi_prefill": (
        "_gluon_bi_kernel",
        lambda: gluon_launch("gluon_batch_invariant_attention", "gluon_batch_invariant_attention"),
    ),
}


def resources(kernel, log: str) -> dict:
    """Figures of a CompiledKernel: ptxas's log of it, its SASS (cuobjdump), Triton's metadata."""
    md = kernel.metadata
    entry = log[log.index(f"Compiling entry function '{md.name}'") :]
    regs = int(re.search(r"Used (\d+) registers", entry).group(1))
    frame = r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
    stack, stores, loads = map(int, re.search(frame, entry).groups())
    # e.g. "(C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due
    # to ... in the function 'name'" ("for the function" in C7512)
    note = rf"\((C\d+)\) Potential Performance Loss: (.*?) \w+ the function '{md.name}'"
    loss = re.search(note, log)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.check_output([knobs.nvidia.cuobjdump.path, "-sass", f.name], text=True)
    inst = r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)"  # opcode, no predicate
    insts = [i for i in re.findall(inst, sass, re.M) if i != "NOP"]
    warp_regs = -(-regs * 32 // 256) * 256  # allocated per warp in units of 256
    ctas = min(
        SM_REGS // warp_regs // md.num_warps,
        SM_SMEM // (md.shared + 1024),  # 1 KB per CTA is reserved
        SM_WARPS // md.num_warps,
    )
    if md.shared > BLOCK_SMEM:
        ctas = 0
    names = kernel.src.fn.arg_names
    blocks = {names[k[0]]: v for k, v in kernel.src.constants.items() if "BLOCK" in names[k[0]]}
    return {
        "n_regs": regs,
        "n_spills": stack // 4,  # Triton's n_spills: local memory bytes / 4
        "spill_bytes": stores + loads,
        "perf_loss": loss and f"{loss.group(1)}: {loss.group(2)}",
        "sass_insts": len(insts),
        "shared": md.shared,
        "ctas_per_sm": ctas,
        **blocks,
        "num_warps": md.num_warps,
        "num_stages": md.num_stages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        default=",".join(VARIANTS),
        help=f"comma-separated, of {[*VARIANTS, *OPTIONAL]}",
    )
    args = parser.parse_args()
    driver.set_active(_StubDriver())
    result = {"triton": triton.__version__, "target": f"sm_{TARGET.arch}"}
    for name in args.only.split(","):
        if name in OPTIONAL:
            kernel, make = OPTIONAL[name]
            module, launch = make()
        else:
            module, kernel, launch = VARIANTS[name]
        with redirect_stdout(io.StringIO()) as log:  # the ptxas log is printed
            compiled = compile_launch(module, kernel, launch)
        result[name] = resources(compiled, log.getvalue())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
