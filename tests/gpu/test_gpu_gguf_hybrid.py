"""GPU: Q8_0 GGUF files of the tiny hybrid MoE models (llama.cpp's `qwen35moe`, and `qwen3next`
with its experts' gate and up fused) run on the GPU path (Triton Gated DeltaNet and fused-MoE
kernels, CUDA graphs) in float32: every greedy token HF's argmax on the values the file holds,
chosen-token logprobs HF's to 1e-3."""

from __future__ import annotations

import os

import pytest
import torch

from tests.models.hf_greedy import assert_greedy_matches_hf

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("arch", ["Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM"])
def test_hybrid_moe_gguf_q8_0_matches_hf(arch: str, tmp_path) -> None:
    gguf = pytest.importorskip("gguf")
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams
    from minivllm.tiny_model import build_tiny_model
    from tests.gguf_files import stored_values, write_gguf

    # Value heads of 32 dims: Q8_0's blocks hold whole heads (tests/test_gguf_hybrid.py).
    overrides = {"mlp_only_layers": []} if arch == "Qwen3NextForCausalLM" else {}
    hf_dir = build_tiny_model(str(tmp_path / "hf"), arch, linear_value_head_dim=32, **overrides)
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    fuse = arch == "Qwen3NextForCausalLM"
    gguf_file = write_gguf(hf_dir, str(tmp_path / "m.gguf"), q8_0, 1, fuse_gate_up=fuse)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    rounded = {name: stored_values(t, q8_0, name) for name, t in tensors.items()}
    save_file(rounded, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    prompts = [[5, 17, 42, 99, 3], list(range(20, 90)), [11], list(range(300, 250, -2))]
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
