"""gpu_memory_utilization as vLLM means it: this engine's share of the card, whatever other
engines or processes hold, and a clear error when that share is not free."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_two_engines_share_one_gpu(model_dir: str) -> None:
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = [{"prompt_token_ids": list(range(10, 200))}]
    first = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.35, max_model_len=2048)
    second = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.35, max_model_len=2048)
    blocks = [llm.engine.executor.num_blocks for llm in (first, second)]
    # The second engine's cache is not shrunk by the first one's 0.35 of the card.
    assert blocks[1] > 0.9 * blocks[0], blocks
    outs = [llm.generate(prompt, params, use_tqdm=False) for llm in (first, second)]
    assert outs[0][0].outputs[0].token_ids == outs[1][0].outputs[0].token_ids
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.5, max_model_len=2048)
    for llm in (first, second):
        llm.shutdown()
    del first, second, llm
    gc.collect()
    torch.cuda.empty_cache()
