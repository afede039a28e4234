"""GPU: every dtype the config accepts runs on CUDA with the triton backend and CUDA graphs
(float32 used to overflow shared memory in the prefill kernel), agreeing with HF float32."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from tests.gpu.conftest import prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# 3 x ~600-token prompts: enough rows for the prefill kernel's large tile config.
TEACHER = prompts(3, 620, seed=4)


@pytest.fixture(scope="module")
def hf_fp32_top1(model_dir: str) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    with torch.no_grad():
        top1 = [
            hf(torch.tensor([p], device="cuda")).logits[0, :-1].argmax(-1).tolist() for p in TEACHER
        ]
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    return top1


@pytest.mark.parametrize("dtype, floor", [("float32", 0.98), ("float16", 0.95)])
def test_dtype_runs_and_agrees_with_hf(model_dir: str, hf_fp32_top1, dtype: str, floor: float):
    from minivllm import LLM, SamplingParams

    llm = LLM(model_dir, dtype=dtype, gpu_memory_utilization=0.4, max_model_len=2048)
    try:
        runner = llm.engine.executor.runner
        assert runner.attn_backend.name == "triton" and runner.graphs is not None
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in TEACHER],
            SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logprobs=1),
            use_tqdm=False,
        )
        ours = [
            [next(t for t, lp in e.items() if lp.rank == 1) for e in out.prompt_logprobs[1:]]
            for out in outs
        ]
        assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
        # Decode through CUDA graphs too: a batch of short prompts.
        short = llm.generate(
            [{"prompt_token_ids": p} for p in prompts(8, 80, seed=5)],
            SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
            use_tqdm=False,
        )
        assert all(len(o.outputs[0].token_ids) == 16 for o in short)
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    pairs = [(a, b) for ra, rb in zip(ours, hf_fp32_top1) for a, b in zip(ra, rb)]
    agreement = sum(a == b for a, b in pairs) / len(pairs)
    print("GPU-DTYPE", json.dumps({"dtype": dtype, "top1_vs_hf_fp32": round(agreement, 4)}))
    assert agreement >= floor
