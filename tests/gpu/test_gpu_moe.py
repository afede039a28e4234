"""GPU: the fused-MoE kernels at Qwen3-30B-A3B's shapes (128 experts, top-8, hidden 2048,
intermediate 768) in bf16 against the torch definition in float32, from one token to a
prefill step; the small-step GEMVs against the grouped GEMMs (bf16, block FP8); a token's
output alone equals its output batched, bit for bit, in deterministic mode."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels.moe.configs import (
    MoeTileConfig,
    gemv_config,
    gemv_max_pairs,
    moe_config,
    step_config,
)
from minivllm.kernels.moe.fused_moe import fused_moe
from minivllm.layers.moe_experts import experts_torch
from minivllm.layers.moe_router import route
from tests.models.hf_greedy import assert_greedy_matches_hf

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

E, H, INTER, TOP_K = 128, 2048, 768, 8


def _case(num_tokens: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(num_tokens, H, device="cuda", generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * INTER, H, device="cuda", generator=g) * H**-0.5).to(dtype)
    w2 = (torch.randn(E, H, INTER, device="cuda", generator=g) * INTER**-0.5).to(dtype)
    logits = torch.randn(num_tokens, E, device="cuda", generator=g)
    topk_weights, topk_ids = route(logits, TOP_K, True)
    return x, w13, w2, topk_weights, topk_ids


@pytest.mark.parametrize("num_tokens", [1, 7, 64, 1000, 4096])
def test_bf16_close_to_float32_reference(num_tokens: int) -> None:
    x, w13, w2, topk_weights, topk_ids = _case(num_tokens, torch.bfloat16)
    out = fused_moe(x, w13, w2, topk_weights, topk_ids)
    ref = experts_torch(x.float(), w13.float(), w2.float(), topk_weights, topk_ids)
    err = (out.float() - ref).abs()
    assert (err.mean() / ref.abs().mean()).item() < 1e-2
    assert (err.max() / ref.abs().max()).item() < 5e-2


def _fp8_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] -> (e4m3 [E, N, K], float32 scales [E, N / 128, K / 128])."""
    from minivllm.layers.quantization.fp8_math import quantize_weight_blocks

    parts = [quantize_weight_blocks(w[e]) for e in range(w.shape[0])]
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 2, 8])
def test_decode_gemv_matches_the_grouped_path(num_tokens: int, fp8: bool) -> None:
    """Both paths at a decode step (the GEMVs named, also where the rule takes the grouped
    path): each pair's output rounded to bf16 as the other rounds it,
    the per-token sums in the same order; only each dot product's order differs."""
    x, w13, w2, topk_weights, topk_ids = _case(num_tokens, torch.bfloat16)
    scales = (None, None)
    if fp8:
        (w13, w13_scale), (w2, w2_scale) = _fp8_blocks(w13), _fp8_blocks(w2)
        scales = (w13_scale, w2_scale)
    shape = (E, H, INTER, TOP_K)
    gemv_tiles = gemv_config(torch.bfloat16, fp8)
    if num_tokens * TOP_K <= gemv_max_pairs(E) and not fp8:  # where the rule takes them
        assert step_config(torch.bfloat16, shape, num_tokens, fp8) == gemv_tiles
    gemv = fused_moe(x, w13, w2, topk_weights, topk_ids, gemv_tiles, *scales)
    grouped_config = moe_config(torch.bfloat16, shape, num_tokens)
    grouped = fused_moe(x, w13, w2, topk_weights, topk_ids, grouped_config, *scales)
    assert gemv.dtype == torch.bfloat16 and gemv.shape == (num_tokens, H)
    err = (gemv.float() - grouped.float()).abs()
    assert (err.max() / grouped.float().abs().max()).item() < 2e-2
    assert (err.mean() / grouped.float().abs().mean()).item() < 5e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_alone_equal_rows_batched(dtype: torch.dtype) -> None:
    x, w13, w2, topk_weights, topk_ids = _case(2048, dtype)
    shape = (E, H, INTER, TOP_K)
    assert moe_config(dtype, shape, 1).block_m != moe_config(dtype, shape, 2048).block_m
    batched = fused_moe(x, w13, w2, topk_weights, topk_ids)
    small = moe_config(dtype, shape, 1)
    forced = fused_moe(x, w13, w2, topk_weights, topk_ids, MoeTileConfig(16, small.gate_up,
                                                                          small.down))  # fmt: skip
    assert torch.equal(forced, batched)
    for t in (0, 1000, 2047):
        rows = slice(t, t + 1)
        alone = fused_moe(x[rows], w13, w2, topk_weights[rows], topk_ids[rows],
                          batch_invariant=True)  # fmt: skip
        assert torch.equal(alone[0], batched[t])


@pytest.mark.parametrize("options", [{}, {"enforce_eager": True}, {"deterministic": True}])
def test_engine_on_tiny_moe_matches_hf(tmp_path, options: dict) -> None:
    """The tiny random Qwen3-MoE through the engine on CUDA in float32 (fused kernels with
    exact dots, CUDA graphs unless eager): greedy tokens are HF's float32 argmax under teacher
    forcing, chosen-token logprobs HF's to 3e-3 (1.2e-3 measured on an H200 while the attention
    kernels took float32 dots as TF32; the default ones now multiply float32 exactly,
    kernels/float32_dot.py, the batch-invariant ones still as TF32); batched equals alone."""
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams
    from minivllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(str(tmp_path / "moe"), "Qwen3MoeForCausalLM")
    prompts = [[5, 17, 42, 99, 3], list(range(20, 57)), [11], list(range(300, 250, -2))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0)
    llm = LLM(model_dir, dtype="float32", gpu_memory_utilization=0.3, **options)
    try:
        requests = [{"prompt_token_ids": p} for p in prompts]
        batched = [o.outputs[0] for o in llm.generate(requests, params, use_tqdm=False)]
        alone = [llm.generate(r, params, use_tqdm=False)[0].outputs[0] for r in requests]
    finally:
        llm.shutdown()
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert_greedy_matches_hf(hf, prompts, batched, 16, tol=3e-3)


def test_engine_on_tiny_moe_gguf_matches_hf(tmp_path) -> None:
    """The tiny Qwen3-MoE as a Q8_0 GGUF file (llama.cpp's qwen3moe, tests/gguf_files.py) through
    the engine on CUDA in float32: greedy tokens are HF's float32 argmax on the values the file
    holds, chosen-token logprobs HF's to 1e-3."""
    import os

    import gguf
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams
    from minivllm.tiny_model import build_tiny_model
    from tests.gguf_files import stored_values, write_gguf

    hf_dir = build_tiny_model(str(tmp_path / "moe"), "Qwen3MoeForCausalLM", mlp_only_layers=[])
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    gguf_file = write_gguf(hf_dir, str(tmp_path / "moe.gguf"), q8_0)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    rounded = {name: stored_values(t, q8_0) for name, t in tensors.items()}
    save_file(rounded, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    prompts = [[5, 17, 42, 99, 3], list(range(20, 57)), [11], list(range(300, 250, -2))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0)
    llm = LLM(gguf_file, tokenizer=hf_dir, dtype="float32", gpu_memory_utilization=0.3)
    try:
        requests = [{"prompt_token_ids": p} for p in prompts]
        completions = [o.outputs[0] for o in llm.generate(requests, params, use_tqdm=False)]
    finally:
        llm.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert_greedy_matches_hf(hf, prompts, completions, 16, tol=1e-3)
