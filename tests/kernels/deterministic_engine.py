"""The deterministic engine's run for the batch-invariance tests (test_batch_invariance_*.py):
the triton backend and GEMMs (in the interpreter on the CPU), greedy, tokens and top logprobs."""

from __future__ import annotations

import torch

from minivllm import LLM, SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU
PROMPTS = [list(range(3 + i, 3 + i + n)) for i, n in enumerate((29, 7, 18, 41))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)


def deterministic_llm(model_dir: str, **options) -> LLM:
    return LLM(
        model_dir,
        dtype="float32",
        device=DEVICE,
        block_size=8,
        attention_backend="triton",
        deterministic=True,
        **options,
    )


def generate_deterministic(
    model_dir: str, prompts: list[list[int]], params: SamplingParams = PARAMS, **options
) -> list[tuple]:
    """The prompts batched in one engine: (token ids, top logprobs) of each."""
    llm = deterministic_llm(model_dir, **options)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.shutdown()
    return tokens_and_logprobs(outs)


def generate_each_alone(model_dir: str, prompts: list[list[int]], **options) -> list[tuple]:
    """Each prompt alone in its step, one after another in one engine (the prompts share no
    first block, so none hits another's prefix cache)."""
    llm = deterministic_llm(model_dir, **options)
    results = []
    for prompt in prompts:
        outs = llm.generate([{"prompt_token_ids": prompt}], PARAMS, use_tqdm=False)
        results += tokens_and_logprobs(outs)
    llm.shutdown()
    return results


def tokens_and_logprobs(outs: list) -> list[tuple]:
    """Each RequestOutput's (token ids, its top logprobs sorted by token id)."""
    results = []
    for out in outs:
        c = out.outputs[0]
        logprobs = [sorted((t, lp.logprob) for t, lp in entry.items()) for entry in c.logprobs]
        results.append((c.token_ids, logprobs))
    return results
