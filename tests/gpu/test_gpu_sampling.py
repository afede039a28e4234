"""GPU: every sampling option at the engine's default limits (max_num_seqs 1,024 on a >= 70 GiB
card, Qwen3's 151,936-token vocabulary) fits the memory that the profile budgeted: the peak of
a full batch of top-p-only (the sort fallback), top-k/top-p, penalized, min_tokens and
max-logprobs requests, and of whole long prompts' prompt logprobs, stays within the engine's
share of the card."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

OPTIONS = [
    {"temperature": 0.6, "top_p": 0.9, "logprobs": 20},  # top-p alone: the sort fallback
    {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05},
    {"temperature": 1.0, "presence_penalty": 0.5, "frequency_penalty": 0.3, "min_tokens": 16},
    {"temperature": 0.0, "logprobs": 20, "repetition_penalty": 1.3},
    {"temperature": 0.8, "top_k": 1024, "min_p": 0.05, "seed": 3, "logprobs": 5},
]


def test_default_limits_sample_every_option_within_the_budget(model_dir: str) -> None:
    from minivllm import LLM, SamplingParams

    gc.collect()
    torch.cuda.empty_cache()
    utilization = 0.9
    total = torch.cuda.mem_get_info()[1]
    llm = LLM(model_dir, dtype="bfloat16", max_model_len=2048,
              gpu_memory_utilization=utilization)  # fmt: skip
    try:
        num_seqs = llm.engine.setup.limits.max_num_seqs
        if total >= 70 * 2**30:
            assert num_seqs == 1024
        params = [
            SamplingParams(max_tokens=24, ignore_eos=True, **OPTIONS[i % len(OPTIONS)])
            for i in range(num_seqs)
        ]
        prompts = [{"prompt_token_ids": [10 + (i * 7 + j) % 5000 for j in range(64)]}
                   for i in range(num_seqs)]  # fmt: skip
        torch.cuda.synchronize()
        runner = llm.engine.executor.runner
        print(f"\nafter start: {torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated, of"
              f" which CUDA graphs {runner.graph_bytes / 2**30:.2f} GiB")  # fmt: skip
        torch.cuda.reset_peak_memory_stats()
        outs = llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        print(f"\npeak {peak / 2**30:.2f} GiB of the engine's {utilization * total / 2**30:.2f}")
        assert peak <= utilization * total
        for i, out in enumerate(outs):
            assert len(out.outputs[0].token_ids) == 24
            num_logprobs = OPTIONS[i % len(OPTIONS)].get("logprobs")
            if num_logprobs:
                assert all(len(e) >= num_logprobs for e in out.outputs[0].logprobs)
        # Prompt logprobs of whole long prompts in one step: scored a few rows at a time.
        long_prompts = [{"prompt_token_ids": [10 + (i * 13 + j) % 5000 for j in range(2000)]}
                        for i in range(4)]  # fmt: skip
        torch.cuda.reset_peak_memory_stats()
        scored = SamplingParams(max_tokens=1, prompt_logprobs=20)
        outs = llm.generate(long_prompts, [scored] * 4, use_tqdm=False)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        print(f"prompt logprobs of 4 x 2000 tokens: peak {peak / 2**30:.2f} GiB")
        assert peak <= utilization * total
        assert all(len(out.prompt_logprobs) == 2000 for out in outs)
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
