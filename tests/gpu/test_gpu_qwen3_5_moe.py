"""GPU: Qwen3.5-MoE and Qwen3-Next (hybrid layers, MLPs of routed experts and a shared expert)
through the engine on CUDA (the router and fused-MoE kernels beside the gated-delta, conv and
attention kernels). Tiny random models in float32 match HF's float32 argmax; Qwen3.5-35B-A3B's
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


def _prompt_top1(model_dir: str, teacher: list[list[int]], **options) -> list:
    """Our top-1 (token, logprob) at every teacher-forced position."""
    from minivllm import LLM, SamplingParams
    from tests.helpers import rank1

    llm = LLM(model_dir, dtype="float32", **options)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        outs = llm.generate([{"prompt_token_ids": p} for p in teacher], params, use_tqdm=False)
    finally:
        llm.shutdown()
    return [[rank1(entry) for entry in o.prompt_logprobs[1:]] for o in outs]


def test_tiny_fp8_qwen3_next_matches_the_cpu_reference(tmp_path) -> None:
    """The tiny block-FP8 Qwen3-Next (tests/fp8_checkpoint.py: in_proj_qkvz and its block scales
    split at load) in float32, teacher-forced: the FP8 GEMM kernels on CUDA against the CPU's
    torch W8A8 reference (which equals the W8A8 product of the dequantized weights,
    tests/models/test_qwen3_next_fp8.py). Both quantize the same float32 activations, so only
    sums in another order differ, and a rare e4m3 rounding they flip."""
    from minivllm.tiny_model import build_tiny_model
    from tests.fp8_checkpoint import FP8_NEXT_SIZES, QWEN_NEXT_FP8, write_fp8_checkpoints

    src = build_tiny_model(str(tmp_path / "src"), "Qwen3NextForCausalLM", **FP8_NEXT_SIZES)
    fp8_dir = str(tmp_path / "fp8")
    write_fp8_checkpoints(src, fp8_dir, str(tmp_path / "ref"), QWEN_NEXT_FP8)
    gen = torch.Generator().manual_seed(3)
    teacher = [torch.randint(0, 400, (n,), generator=gen).tolist() for n in (40, 64, 100, 23)]
    cpu = _prompt_top1(fp8_dir, teacher, device="cpu")
    gpu = _prompt_top1(fp8_dir, teacher, gpu_memory_utilization=0.3)
    pairs = [
        (a, b)
        for row_a, row_b in zip(gpu, cpu, strict=True)
        for a, b in zip(row_a, row_b, strict=True)
    ]
    agree = sum(a[0] == b[0] for a, b in pairs) / len(pairs)
    error = max(abs(a[1] - b[1]) for a, b in pairs if a[0] == b[0])
    print("GPU-FP8-QWEN3-NEXT", json.dumps({"positions": len(pairs), "top1": agree, "err": error}))
    assert agree >= 0.95 and error < 0.05
