"""GPU: Qwen3.5-MoE and Qwen3-Next (hybrid layers, MLPs of routed experts and a shared expert)
through the engine on CUDA (the router and fused-MoE kernels beside the gated-delta, conv and
attention kernels). Tiny random models in float32 match HF's float32 argmax; the tiny block-FP8
Qwen3-Next's FP8 GEMM and fused-MoE calls equal torch's on the same inputs; Qwen3.5-35B-A3B's
shapes with dummy weights (8 of its 40 layers, so that it fits any card) run."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = [[5, 17, 42, 99, 3], list(range(20, 90)), [11], list(range(400, 270, -1))]


def _generate(llm, prompts: list[list[int]], max_tokens: int) -> list:
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    requests = [{"prompt_token_ids": p} for p in prompts]
    return [o.outputs[0] for o in llm.generate(requests, params, use_tqdm=False)]


@pytest.mark.parametrize("architecture", ["Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM"])
@pytest.mark.parametrize(
    "options",
    [{}, {"enforce_eager": True}, {"max_num_batched_tokens": 40}, {"deterministic": True}],
    ids=["graphs", "eager", "chunked", "deterministic"],
)  # fmt: skip
def test_tiny_float32_matches_hf(tmp_path, options: dict, architecture: str) -> None:
    """Greedy tokens are HF's float32 argmax under teacher forcing, chosen-token logprobs HF's
    to 1e-3; batched equals alone."""
    from transformers import AutoModelForCausalLM

    from minivllm import LLM
    from minivllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(str(tmp_path / "tiny"), architecture)
    llm = LLM(model_dir, dtype="float32", gpu_memory_utilization=0.3, **options)
    try:
        batched = _generate(llm, PROMPTS, 16)
        alone = [_generate(llm, [p], 16)[0] for p in PROMPTS]
    finally:
        llm.shutdown()
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    for prompt, completion in zip(PROMPTS, batched, strict=True):
        tokens = list(completion.token_ids)
        with torch.no_grad():
            ids = torch.tensor([prompt + tokens], device="cuda")
            logits = hf(ids).logits[0, len(prompt) - 1 : -1].float()
        assert tokens == logits.argmax(-1).tolist()
        logprobs = logits.log_softmax(-1)
        for i, token in enumerate(tokens):
            ours = completion.logprobs[i][token].logprob
            assert ours == pytest.approx(logprobs[i, token].item(), abs=1e-3)


def test_dummy_qwen3_5_35b_a3b_layers_run(tmp_path) -> None:
    """Qwen3.5-35B-A3B's layer shapes (256 experts of 512, top-8, a shared expert; 6 Gated
    DeltaNet and 2 full-attention layers of its 40) with dummy weights in bf16: a batch of long
    and short prompts runs to its token count."""
    from minivllm import LLM
    from minivllm.tiny_model import make_dummy_model_dir

    model_dir = make_dummy_model_dir("qwen3.5-35b-a3b", str(tmp_path / "q35-35b"))
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    text = config["text_config"]
    text["num_hidden_layers"], text["layer_types"] = 8, text["layer_types"][:8]
    with open(path, "w") as f:
        json.dump(config, f)
    llm = LLM(model_dir, load_format="dummy", max_model_len=4096, gpu_memory_utilization=0.85)
    try:
        assert llm.engine.executor.runner.model.model.layers[0].mlp.experts.use_triton
        prompts = [list(range(1, 1 + n)) for n in (1, 63, 64, 65, 1000, 3000)]
        completions = _generate(llm, prompts, 16)
    finally:
        llm.shutdown()
    assert [len(c.token_ids) for c in completions] == [16] * len(prompts)


def _checked_fp8_calls(llm, errors: dict) -> None:
    """Wraps the engine's block-FP8 GEMM and each fused-MoE layer so that every call also runs
    the torch reference on the same inputs; errors[(kind, weight shape)] collects the largest
    error relative to the reference's largest value."""
    from minivllm.layers.fused_moe import FusedMoE
    from minivllm.layers.moe_experts import experts_torch
    from minivllm.layers.quantization.fp8_math import block_fp8_linear_ref

    def record(kind: str, shape: tuple, got: torch.Tensor, expected: torch.Tensor) -> None:
        error = ((got - expected).abs().max() / expected.abs().max()).item()
        errors[(kind, shape)] = max(error, errors.get((kind, shape), 0.0))

    model = llm.engine.executor.runner.model
    method = model.model.layers[0].linear_attn.in_proj_qkv.quant_method
    kernel = method.gemm

    def gemm(x, wq, ws, bias=None):
        y = kernel(x, wq, ws, bias)
        record("linear", tuple(wq.shape), y, block_fp8_linear_ref(x, wq, ws, bias))
        return y

    method.gemm = gemm
    for layer in model.modules():
        if isinstance(layer, FusedMoE):
            layer._fused_moe = _checked_moe(layer, layer._fused_moe, experts_torch, record)


def _checked_moe(layer, fused, reference, record):
    def run(x, w13, w2, weights, ids, out, w13_scale, w2_scale, batch_invariant):
        y = fused(x, w13, w2, weights, ids, out, w13_scale, w2_scale, batch_invariant)
        expected = reference(x, w13, w2, weights, ids, layer.expert_gemm, (w13_scale, w2_scale))
        record("experts", tuple(w13.shape), y, expected)
        return y

    return run


def test_tiny_fp8_qwen3_next_kernels_equal_torch_inside_the_engine(tmp_path) -> None:
    """The tiny block-FP8 Qwen3-Next (tests/fp8_checkpoint.py: in_proj_qkvz and its block scales
    split at load) in float32 on CUDA: every block-FP8 GEMM and fused-MoE call of a run equals
    the torch W8A8 reference on the same inputs (the CPU engine's path, which
    tests/models/test_qwen3_next_fp8.py holds to the W8A8 product of the dequantized weights).

    Per call, not end to end: this random model amplifies rounding, since an e4m3 rounding of
    the activations flips with any change in the last bits (on the CPU, the reference path with
    its GEMM inputs scaled by 1 + 1e-6 noise agrees on 95 % of the top-1 tokens, with 1e-4 on
    73 %), so the CUDA engine's top-1 tokens agree with the CPU's on only ~78 %."""
    from minivllm import LLM, SamplingParams
    from minivllm.tiny_model import build_tiny_model
    from tests.fp8_checkpoint import FP8_NEXT_SIZES, QWEN_NEXT_FP8, write_fp8_checkpoints

    src = build_tiny_model(str(tmp_path / "src"), "Qwen3NextForCausalLM", **FP8_NEXT_SIZES)
    fp8_dir = str(tmp_path / "fp8")
    write_fp8_checkpoints(src, fp8_dir, str(tmp_path / "ref"), QWEN_NEXT_FP8)
    llm = LLM(fp8_dir, dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True)
    errors: dict = {}
    try:
        _checked_fp8_calls(llm, errors)
        gen = torch.Generator().manual_seed(3)
        prompts = [torch.randint(0, 400, (n,), generator=gen).tolist() for n in (40, 64, 100, 23)]
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=1)
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()
    print("GPU-FP8-QWEN3-NEXT", json.dumps({f"{k[0]} {k[1]}": v for k, v in errors.items()}))
    # Every quantized projection: attention's q (with its gate), k, v, o; the gated delta's
    # split qkv and z and its out; the shared expert's gate_up and down; the routed experts.
    assert {kind for kind, _ in errors} == {"linear", "experts"} and len(errors) >= 8
    # A GEMM's inputs are quantized alike in both (equal e4m3 bytes); the sums differ. Hopper's
    # FP8 tensor cores add each 128-deep block's products with fewer bits than float32 (about
    # 14, as DeepSeek-V3's report measured) before the kernel scales the block into its
    # float32 total: 4-6e-4 of the largest value on an H200. The experts quantize their
    # SiLU-mul activations again inside each path, so a difference in the gate/up sums can flip
    # an e4m3 rounding (a step of 1/8): 1.6e-2 there. A wrong scale, tile or expert gives
    # errors of order one.
    assert max(v for (kind, _), v in errors.items() if kind == "linear") < 3e-3
    assert max(v for (kind, _), v in errors.items() if kind == "experts") < 5e-2
