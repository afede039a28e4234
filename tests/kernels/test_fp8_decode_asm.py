"""decode_attention's inline-asm V conversion (v_cvt_asm; by default on wherever it can run):
refused when asked for in the interpreter and left off there by default, compiled for sm_90
without a GPU (ptxas accepts the PTX; the plain-cast kernel never contains it), and on a GPU
the same output as the plain-cast fp8 path (element order) and the one the default takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paged_case import DEVICE, make_paged_case, ref_attention

from minivllm.kernels.decode_attention import decode_attention

FP8 = torch.float8_e4m3fn
ROOT = Path(__file__).resolve().parents[2]


def _fp8_case(seq_lens, num_kv_heads, head_dim, block_size):
    """A paged case whose cache is e4m3 and whose contexts are the values it holds."""
    case = make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, torch.float32)
    contexts = [(k.to(FP8).float(), v.to(FP8).float()) for k, v in case.contexts]
    return case.kv_cache.to(FP8), case.block_tables, case.seq_lens, contexts


def _decode(q, cache, block_tables, seq_lens, num_splits, config=None, v_cvt_asm=False):
    num_seqs, num_heads, head_dim = q.shape
    out = torch.full_like(q, float("nan"))
    mid_o = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=q.device)
    mid_lse = torch.empty(mid_o.shape[:3], device=q.device)
    return decode_attention(q, cache, block_tables, seq_lens, head_dim**-0.5, out, num_splits,
                            mid_o, mid_lse, config=config, v_cvt_asm=v_cvt_asm)  # fmt: skip


def test_v_cvt_asm_refused_in_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # set on a CPU already; on a GPU too: refused
    cache, block_tables, seq_lens, _ = _fp8_case([5, 17], 2, 32, 16)
    q = torch.randn(2, 4, 32, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="v_cvt_asm=True is inline PTX: CUDA only"):
        _decode(q, cache, block_tables, seq_lens, 1, v_cvt_asm=True)


def test_v_cvt_asm_left_off_by_default_where_it_cannot_run(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cache, block_tables, seq_lens, contexts = _fp8_case([5, 17], 2, 32, 16)
    q = torch.randn(2, 4, 32, dtype=torch.float16, device=DEVICE)
    auto = _decode(q, cache, block_tables, seq_lens, 1, v_cvt_asm=None)  # no error: plain cast
    assert torch.equal(auto, _decode(q, cache, block_tables, seq_lens, 1, v_cvt_asm=False))
    expected = ref_attention(q[1:2].float(), *contexts[1], 32**-0.5)[0]
    torch.testing.assert_close(auto[1].float().cpu(), expected, atol=2e-2, rtol=2e-2)


# Compiles _decode_kernel for sm_90 in a fresh process (the interpreter's triton cannot),
# with and without V_CVT_ASM, and prints what the test checks in the PTX.
_COMPILE_SM90 = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from minivllm.kernels.decode_attention import _decode_kernel

const = {"num_splits": 1, "NUM_KV_HEADS": 8, "GROUP": 2, "HEAD_DIM": 128, "BLOCK_SIZE": 16,
         "BLOCK_G": 16, "BLOCK_N": 128, "BLOCK_D": 128, "SPLIT": False, "KV_FP8": True,
         "HAS_ORDER": True}
types = {"q_ptr": "*bf16", "cache_ptr": "*fp8e4nv", "out_ptr": "*bf16", "mid_o_ptr": "*fp32",
         "mid_lse_ptr": "*fp32", "scale_log2e": "fp32", "v_scale": "fp32"}
found = {}
for asm in (False, True):
    c = {**const, "V_CVT_ASM": asm}
    sig = {n: "constexpr" if n in c else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
           for n in _decode_kernel.arg_names}
    k = triton.compile(ASTSource(_decode_kernel, sig, c), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_stages": 3})
    ptx = k.asm["ptx"]
    found[str(asm)] = {"asm_cvt": ptx.count("mov.b32 {lo, hi}"),
                       "ldmatrix_trans": ptx.count("ldmatrix.sync.aligned.m8n8.x4.trans"),
                       "cubin": len(k.asm["cubin"])}
print(json.dumps(found))
"""


def test_v_cvt_asm_compiles_for_sm90_and_only_when_asked(tmp_path):
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton has no CUDA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _COMPILE_SM90], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["False"]["asm_cvt"] == 0  # the default kernel never takes the asm
    # Each thread converts its 16-byte V loads in registers (4 bytes an asm) and the tile is
    # read back as fp16 by ldmatrix.trans: the code this variant exists for.
    assert found["True"]["asm_cvt"] > 0 and found["True"]["ldmatrix_trans"] > 0
    assert found["True"]["cubin"] > 0  # ptxas accepted the inline PTX


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs CUDA sm_89+",
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,block_size,num_splits,config",
    [
        (16, 8, 128, 16, 1, None),
        (16, 8, 128, 16, 4, None),
        (16, 8, 128, 16, 1, (128, 4, 5)),
        (32, 4, 64, 32, 3, (64, 8, 5)),
        (8, 8, 256, 16, 1, None),
        (4, 2, 32, 8, 2, (16, 4, 2)),
    ],
)
def test_v_cvt_asm_equals_default_fp8_on_gpu(
    dtype, num_heads, num_kv_heads, head_dim, block_size, num_splits, config
):
    seq_lens = [1000, 1, 16, 17, 127, 128, 129, 513, 0]
    cache, block_tables, seq_lens_t, contexts = _fp8_case(
        seq_lens, num_kv_heads, head_dim, block_size
    )
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    args = (q, cache, block_tables, seq_lens_t, num_splits, config)
    default, asm = _decode(*args), _decode(*args, v_cvt_asm=True)
    assert torch.equal(_decode(*args, v_cvt_asm=None), asm)  # the default takes the asm here
    # The same cvt on the same bytes: a wrong element order is off by O(output), not by ulps.
    torch.testing.assert_close(asm, default, atol=1e-3, rtol=2**-7)
    for i, (k, v) in enumerate(contexts):
        if seq_lens[i]:
            expected = ref_attention(q[i : i + 1], k, v, head_dim**-0.5)[0]
            torch.testing.assert_close(asm[i].cpu().float(), expected, atol=2e-2, rtol=2e-2)
        else:
            assert not asm[i].any()
