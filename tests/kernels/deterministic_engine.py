"""The deterministic engine's run for the batch-invariance tests (test_batch_invariance_*.py):
the triton backend and GEMMs (in the interpreter on the CPU), greedy, tokens and top logprobs."""

from __future__ import annotations

import torch

from minivllm import LLM, SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU
PROMPTS = [list(range(3 + i, 3 + i + n)) for i, n in enumerate((29, 7, 18, 41))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)


def generate_deterministic(model_dir: str, prompts: list[list[int]], **options) -> list[tuple]:
    llm = LLM(
        model_dir,
        dtype="float32",
        device=DEVICE,
        block_size=8,
        attention_backend="triton",
        deterministic=True,
        **options,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    llm.shutdown()
    results = []
    for out in outs:
        c = out.outputs[0]
        logprobs = [sorted((t, lp.logprob) for t, lp in entry.items()) for entry in c.logprobs]
        results.append((c.token_ids, logprobs))
    return results
