"""GPU, bf16, real sizes: deterministic mode is batch-invariant bit for bit, at the kernels (real
MMAs, unlike the interpreter) and end to end (neighbours, chunking, graph padding, eager).
`pytest -m gpu -s tests/gpu/test_gpu_deterministic.py` prints what cuBLAS does for comparison."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.gpu.conftest import prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_matmul_rows_independent_of_m() -> None:
    import torch.nn.functional as F

    from minivllm.kernels.matmul import matmul

    gen = torch.Generator(device="cuda").manual_seed(0)
    for k, n in ((1024, 4096), (3072, 1024), (1024, 151936)):
        x = torch.randn(4096, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
        full = matmul(x, w)
        torch.testing.assert_close(full.float(), F.linear(x, w).float(), atol=3e-2, rtol=3e-2)
        for m in (1, 7, 37, 64, 256, 1000):
            assert torch.equal(matmul(x[:m], w), full[:m]), f"K={k} N={n} M={m}"
            assert torch.equal(matmul(x[m - 1 : m], w)[0], full[m - 1])
        # For the record: does cuBLAS change a row's bits with M, by default and with split-K
        # forbidden (torch >= 2.10: (allow_reduced_precision, allow_splitk))?
        # allow_splitk=False needs the cuBLASLt backend (torch 2.11 raises otherwise).
        setting = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        library = torch.backends.cuda.preferred_blas_library()
        for label, value in (("default", setting), ("no split-K", (False, False))):
            try:
                if label == "no split-K":
                    torch.backends.cuda.preferred_blas_library("cublaslt")
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = value
                ref = F.linear(x, w)
                differ = sum(
                    not torch.equal(F.linear(x[:m], w), ref[:m]) for m in (1, 7, 37, 64, 256, 1000)
                )
                print(f"\nGPU-determinism cuBLAS {label} K={k} N={n}: {differ} of 6 M differ")
            except RuntimeError as err:
                print(f"\nGPU-determinism cuBLAS {label} K={k} N={n}: skipped ({err})")
            finally:
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = setting
                torch.backends.cuda.preferred_blas_library(library)


def test_invariant_gemm_rows_independent_of_m() -> None:
    """Deterministic mode's GEMM on CUDA (cuBLAS at the rungs where it matched the Triton GEMM,
    the Triton GEMM elsewhere): off the ladder, eagerly and replayed in a CUDA graph, a row has
    the bits it has in a 4,096-row product and in the Triton GEMM. Qwen3-0.6B's shapes, bf16."""
    import torch.nn.functional as F

    from minivllm.kernels.matmul import matmul
    from minivllm.layers.invariant_gemm import InvariantGemm

    device = torch.device("cuda")
    shapes = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151936, 1024))
    gemm = InvariantGemm(matmul, max_rows=4096)
    counts = gemm.verify([(n, k, torch.bfloat16, False) for n, k in shapes], device)
    rungs = [(key[:2], count) for key, count in counts.items()]
    print(f"\nGPU-determinism InvariantGemm cuBLAS rungs per shape: {rungs}")
    gen = torch.Generator(device="cuda").manual_seed(3)
    for n, k in shapes:
        x = torch.randn(4096, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
        full = gemm(x, w)
        torch.testing.assert_close(full.float(), F.linear(x, w).float(), atol=3e-2, rtol=3e-2)
        assert torch.equal(full, matmul(x, w)), f"N={n} K={k}"
        for m in (1, 3, 37, 100, 1000, 3000):
            assert torch.equal(gemm(x[:m], w), full[:m]), f"N={n} K={k} M={m}"
        static = x[:37].clone()
        gemm(static, w)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = gemm(static, w)
        graph.replay()
        assert torch.equal(out, full[:37]), f"graph N={n} K={k}"


def test_matmul_table_rows_independent_of_m() -> None:
    """Every shape of kernels/matmul_configs.TABLE (the tuned M buckets, bf16): a row has the
    same bits at M = 1, 7 and on both sides of every bucket bound as in a 4096-row product."""
    from minivllm.kernels.matmul import matmul
    from minivllm.kernels.matmul_configs import TABLE, check_buckets

    shapes = dict(TABLE) or {(4096, 1024): ((4096, (64, 128, 64, 4, 4)),)}  # empty: the rule
    gen = torch.Generator(device="cuda").manual_seed(2)
    for (n, k), buckets in shapes.items():
        check_buckets(buckets)
        x = torch.randn(4096, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
        full = matmul(x, w)
        bounds = [b for max_m, _ in buckets for b in (max_m, max_m + 1)]
        for m in sorted({1, 7, *bounds} & set(range(1, 4097))):
            assert torch.equal(matmul(x[:m], w), full[:m]), f"N={n} K={k} M={m}"


def test_attention_prefill_chunks_decode_split_same_bits() -> None:
    from minivllm.kernels.attention_segments import SEGMENTS
    from minivllm.kernels.batch_invariant_attention import batch_invariant_attention

    heads, kv_heads, head_dim, block_size, length = 16, 8, 128, 16, 1500
    gen = torch.Generator(device="cuda").manual_seed(1)
    num_blocks = length // block_size + 8
    cache = torch.randn(
        2, num_blocks, block_size, kv_heads, head_dim, device="cuda", generator=gen
    ).to(torch.bfloat16)
    table = torch.randperm(num_blocks, device="cuda", generator=gen).int()[None]
    q = torch.randn(length, heads, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    scale = head_dim**-0.5

    def varlen(rows: torch.Tensor, start: int, end: int) -> torch.Tensor:
        qsl = torch.tensor([0, end - start], dtype=torch.int32, device="cuda")
        lens = torch.tensor([end], dtype=torch.int32, device="cuda")
        out = torch.empty_like(rows)
        return batch_invariant_attention(rows, cache, qsl, lens, table, scale, out)

    whole = varlen(q, 0, length)
    for a, b in ((0, 256), (256, 700), (700, 1101), (1101, length)):
        assert torch.equal(varlen(q[a:b].contiguous(), a, b), whole[a:b]), f"chunk {a}:{b}"
    # Segments of 128 keys up to 1,024 (one to eight of them), then 256: chunk 700:1101's
    # tiles straddle 1023|1024.
    positions = [0, 63, 64, 127, 128, 511, 512, 513, 1023, 1024, 1499]
    n = len(positions)
    qsl = torch.arange(n + 1, dtype=torch.int32, device="cuda")
    lens = torch.tensor([p + 1 for p in positions], dtype=torch.int32, device="cuda")
    rows = q[positions].contiguous()
    tables = table.expand(n, -1).contiguous()
    plain = batch_invariant_attention(
        rows, cache, qsl, lens, tables, scale, torch.empty_like(rows), decode_rows=True
    )  # the decode tiles (their own config) against the prefill tiles
    assert torch.equal(plain, whole[positions])
    segs = SEGMENTS.max_count(length)
    parts = {
        "part_acc": torch.empty(n, heads, segs, head_dim, device="cuda"),
        "part_m": torch.empty(n, heads, segs, device="cuda"),
        "part_l": torch.empty(n, heads, segs, device="cuda"),
    }
    split = batch_invariant_attention(
        rows, cache, qsl, lens, tables, scale, torch.empty_like(rows), num_segments=segs, **parts
    )
    assert torch.equal(split, whole[positions])


def _generate(llm, batch: list[list[int]], alone: bool = False) -> list[tuple]:
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=0)
    groups = [[p] for p in batch] if alone else [batch]
    out = []
    for group in groups:
        for o in llm.generate([{"prompt_token_ids": p} for p in group], params, use_tqdm=False):
            c = o.outputs[0]
            out.append((c.token_ids, [e[t].logprob for t, e in zip(c.token_ids, c.logprobs)]))
    return out


def test_deterministic_engine_batch_invariant(model_dir: str) -> None:
    from minivllm import LLM

    batch = [p[: 40 + 61 * i] for i, p in enumerate(prompts(10, 700, seed=3))]
    base = {
        "dtype": "bfloat16",
        "deterministic": True,
        "gpu_memory_utilization": 0.4,
        "max_model_len": 2048,
        "max_num_seqs": 16,
        "max_cuda_graph_batch_size": 16,
    }
    results = {}
    llm = LLM(model_dir, **base)
    try:
        ref = _generate(llm, batch)
        results["warm_prefix_cache"] = _generate(llm, batch)
        results["alone"] = _generate(llm, batch[:4], alone=True) + ref[4:]
    finally:
        llm.shutdown()
        del llm  # else the next LLM's KV profiling finds this one's cache still in use
        gc.collect()
        torch.cuda.empty_cache()
    for name, extra in (
        ("chunked_256", {"max_num_batched_tokens": 256}),
        ("preempt", {"num_gpu_blocks_override": 48}),
        ("eager", {"enforce_eager": True}),
    ):
        llm = LLM(model_dir, **(base | extra))
        try:
            results[name] = _generate(llm, batch)
        finally:
            llm.shutdown()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    for name, got in results.items():
        same = sum(g == r for g, r in zip(got, ref))
        print(f"\nGPU-determinism {name}: {same} of {len(ref)} identical (tokens and logprobs)")
        assert same == len(ref), name
