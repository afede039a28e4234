"""GPU: the fp8 (e4m3) KV cache. Store kernel bytes against torch's cast, bf16 attention over
an fp8 cache against a torch oracle that dequantizes it, and the engine's greedy top-1
agreement with HF fp32 on the random parity model for bf16 and fp8 KV (`pytest -m gpu -s`)."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from tests.gpu.conftest import prompts
from tests.helpers import rank1, top1_figures

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

FP8 = torch.float8_e4m3fn


def _quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-448.0, 448.0).to(FP8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_store_kv_fp8_bytes(dtype: torch.dtype, scale: float) -> None:
    from minivllm.kernels.kv_store import store_kv

    gen = torch.Generator(device="cuda").manual_seed(0)
    # Magnitudes from subnormal e4m3 (< 2**-6) to past the saturation point (448).
    x = torch.randn(4096, 8, 128, device="cuda", generator=gen)
    x = (x * torch.logspace(-4, 3, 128, device="cuda")).to(dtype)
    cache = torch.zeros(2, 300, 16, 8, 128, dtype=FP8, device="cuda")
    slots = torch.randperm(300 * 16, device="cuda", generator=gen)[:4096]
    store_kv(x, -x, cache, slots, scale, scale)
    flat = cache.view(torch.uint8).view(2, -1, 8, 128)
    assert torch.equal(flat[0, slots], _quantize(x, scale).view(torch.uint8))
    assert torch.equal(flat[1, slots], _quantize(-x, scale).view(torch.uint8))


def _fp8_case(seq_lens: list[int], num_kv_heads: int, head_dim: int, k_scale, v_scale):
    """An fp8 paged cache (random block order) and each request's dequantized (k, v)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    counts = [-(-n // 16) for n in seq_lens]
    cache = torch.randn(2, sum(counts) + 1, 16, num_kv_heads, head_dim, device="cuda",
                        generator=gen)  # fmt: skip
    cache = torch.stack([_quantize(cache[0], k_scale), _quantize(cache[1], v_scale)])
    perm = torch.randperm(sum(counts), device="cuda", generator=gen).int() + 1
    block_tables = torch.zeros(len(seq_lens), max(counts), dtype=torch.int32, device="cuda")
    contexts, start = [], 0
    for i, (n, c) in enumerate(zip(seq_lens, counts)):
        block_tables[i, :c] = perm[start : start + c]
        start += c
        blocks = block_tables[i, :c].long()
        k = cache[0, blocks].flatten(0, 1)[:n].float() * k_scale
        v = cache[1, blocks].flatten(0, 1)[:n].float() * v_scale
        contexts.append((k, v))
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return cache.contiguous(), block_tables, seq_lens_t, contexts


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Causal attention of the last len(q) positions, float32."""
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf = k.repeat_interleave(group, 1).transpose(0, 1)
    vf = v.repeat_interleave(group, 1).transpose(0, 1)
    s = qf @ kf.transpose(1, 2) * scale
    n, seq_len = q.shape[0], k.shape[0]
    q_pos = torch.arange(seq_len - n, seq_len, device="cuda")
    s = s.masked_fill(torch.arange(seq_len, device="cuda")[None, :] > q_pos[:, None], -torch.inf)
    return (s.softmax(-1) @ vf).transpose(0, 1)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_and_prefill_bf16_over_fp8_cache(num_splits: int) -> None:
    from minivllm.kernels.batch_invariant_attention import batch_invariant_attention
    from minivllm.kernels.decode_attention import decode_attention
    from minivllm.kernels.prefill_attention import prefill_attention

    seq_lens, query_lens, k_scale, v_scale = [1, 100, 1000, 2049], [1, 37, 300, 2049], 0.5, 2.0
    cache, block_tables, seq_lens_t, contexts = _fp8_case(seq_lens, 8, 128, k_scale, v_scale)
    scale = 128**-0.5
    gen = torch.Generator(device="cuda").manual_seed(2)
    dq = torch.randn(4, 16, 128, device="cuda", generator=gen).bfloat16()
    out = torch.empty_like(dq)
    mid_o = torch.empty(4, 16, num_splits, 128, device="cuda")
    mid_lse = torch.empty(4, 16, num_splits, device="cuda")
    decode_attention(dq, cache, block_tables, seq_lens_t, scale, out, num_splits, mid_o, mid_lse,
                     k_scale=k_scale, v_scale=v_scale)  # fmt: skip
    for i, (k, v) in enumerate(contexts):
        expected = _reference(dq[i : i + 1], k, v, scale)[0]
        torch.testing.assert_close(out[i].float(), expected, atol=2e-2, rtol=2e-2)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    pq = torch.randn(int(starts[-1]), 16, 128, device="cuda", generator=gen).bfloat16()
    qsl = starts.cuda()
    for attention in (prefill_attention, batch_invariant_attention):
        out = attention(pq, cache, qsl, seq_lens_t, block_tables, scale, torch.empty_like(pq),
                        k_scale=k_scale, v_scale=v_scale)  # fmt: skip
        for i, (k, v) in enumerate(contexts):
            rows = slice(int(starts[i]), int(starts[i + 1]))
            expected = _reference(pq[rows], k, v, scale)
            torch.testing.assert_close(out[rows].float(), expected, atol=2e-2, rtol=2e-2)


def _hf_fp32(model_dir: str, teacher: list[list[int]]) -> list[torch.Tensor]:
    """HF fp32 log-probabilities [len - 1, vocab] of each teacher prompt (on the CPU)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    with torch.no_grad():
        logprobs = [
            hf(torch.tensor([p], device="cuda")).logits[0, :-1].log_softmax(-1).cpu()
            for p in teacher
        ]
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    return logprobs


def _ours(model_dir: str, teacher: list[list[int]], kv_cache_dtype: str, backend: str) -> dict:
    """Our top-1 token and its logprob at every teacher position, and the KV block count."""
    from minivllm import LLM, SamplingParams

    llm = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.5, max_model_len=4096,
              kv_cache_dtype=kv_cache_dtype, attention_backend=backend)  # fmt: skip
    try:
        runner = llm.engine.executor.runner
        assert runner.attn_backend.name == backend
        assert runner.kv_caches[0].dtype == (FP8 if kv_cache_dtype == "fp8" else torch.bfloat16)
        num_blocks = runner.kv_caches[0].shape[1]
        del runner
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in teacher],
            SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
            use_tqdm=False,
        )
        top1 = [[rank1(entry) for entry in o.prompt_logprobs[1:]] for o in outs]
        return {"top1": top1, "num_blocks": num_blocks}
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


def test_engine_fp8_kv_top1_vs_hf_fp32(model_dir: str) -> None:
    """e4m3 keeps 3 mantissa bits, so an fp8 cache moves logits more than a bf16 one (on this
    random model: top-1 0.88 vs 0.96 against HF fp32). The oracle for our fp8 kernels is the
    same cache read by torch (the torch_sdpa backend dequantizes with torch's own e4m3 cast):
    the Triton kernels must be as close to HF as that."""
    teacher = prompts(8, 512)
    hf = _hf_fp32(model_dir, teacher)
    figures = {}
    for name, kv, backend in (("auto", "auto", "triton"), ("fp8", "fp8", "triton"),
                              ("fp8_torch", "fp8", "torch_sdpa")):  # fmt: skip
        ours = _ours(model_dir, teacher, kv, backend)
        figures[name] = top1_figures(hf, ours["top1"]) | {"num_kv_blocks": ours["num_blocks"]}
    print("GPU-FP8-KV-PARITY", json.dumps(figures))
    fp8, oracle = figures["fp8"], figures["fp8_torch"]
    assert fp8["top1_vs_hf_fp32"] >= oracle["top1_vs_hf_fp32"] - 0.01
    assert fp8["chosen_logprob_abs_err_mean"] <= 1.1 * oracle["chosen_logprob_abs_err_mean"] + 0.005
    # Half the bytes per element: about twice the blocks (activations take the same memory).
    assert fp8["num_kv_blocks"] >= 1.9 * figures["auto"]["num_kv_blocks"]
