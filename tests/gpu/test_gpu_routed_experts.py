"""GPU: enable_return_routed_experts on the tiny random Qwen3-MoE in float32, with CUDA graphs
(decode graphs and piecewise graphs replay the sparse layers' writes into the static routing
buffer) and eagerly: every forwarded token's experts are HF's router top-k, batched, with
chunked prefill and a prefix-cache hit."""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_routing import assert_routing_matches_hf

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = [[5, 17, 42, 99, 3], list(range(20, 57)), [11], list(range(300, 250, -2))]
# The attention kernels take float32 inputs as TF32 on the GPU: router logits move by ~1e-3,
# so experts whose logits are that close are a tie.
TIE_TOL = 5e-3


# 20 tokens a step: chunked prefill, and piecewise graphs whose top bucket (32) pads past the
# step's largest.
@pytest.mark.parametrize("options", [{}, {"enforce_eager": True}, {"max_num_batched_tokens": 20}])
def test_routing_on_cuda_matches_hf(tmp_path, options: dict) -> None:
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams
    from minivllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(str(tmp_path / "moe"), "Qwen3MoeForCausalLM")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(
        model_dir,
        dtype="float32",
        gpu_memory_utilization=0.3,
        enable_return_routed_experts=True,
        **options,
    )
    try:
        if not options:
            assert llm.engine.executor.runner.graphs is not None  # decode steps replay graphs
        requests = [{"prompt_token_ids": p} for p in PROMPTS]
        batched = [o.outputs[0] for o in llm.generate(requests, params, use_tqdm=False)]
        # The second prompt again, longer: its first 36 tokens hit the prefix cache.
        longer = PROMPTS[1] + [400, 401, 402]
        [hit] = llm.generate([{"prompt_token_ids": longer}], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert hit.num_cached_tokens > 0
    assert_routing_matches_hf(hf, PROMPTS, batched, TIE_TOL)
    assert_routing_matches_hf(hf, [longer], [hit.outputs[0]], TIE_TOL)
