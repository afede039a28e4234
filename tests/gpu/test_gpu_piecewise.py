"""GPU: mixed steps replayed as piecewise CUDA graphs (engine/runner/graphs/piecewise_graph.py)
against the same steps run eagerly, on a random-weight Qwen3-0.6B-shaped model in float32 (so that
the padded GEMM shapes of a bucket cannot flip a near-tie)."""

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


def run(model_dir: str, max_mixed_graph_tokens: int) -> tuple[list, list, list[int]]:
    from minivllm import LLM, SamplingParams

    # A 512-token budget chunks the 300-token prompts: steps mix prefill chunks and decodes.
    llm = LLM(model_dir, dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048,
              max_num_batched_tokens=512, max_cuda_graph_batch_size=16,
              max_mixed_graph_tokens=max_mixed_graph_tokens)  # fmt: skip
    try:
        runner = llm.engine.executor.runner
        steps: list[int] = []
        if runner.mixed_graphs is not None:
            real = runner.mixed_graphs.run
            runner.mixed_graphs.run = lambda ids, *a: steps.append(ids.shape[0]) or real(ids, *a)
        params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=0)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts(12, 300, seed=4)], params,
                            use_tqdm=False)  # fmt: skip
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        logprobs = [
            [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
            for o in outs
        ]
        return tokens, logprobs, steps
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


def test_piecewise_mixed_steps_equal_eager_mixed_steps(model_dir: str) -> None:
    eager_tokens, eager_lps, eager_steps = run(model_dir, 0)
    tokens, lps, steps = run(model_dir, 4096)
    assert not eager_steps and steps and max(steps) > 16  # prefill-sized steps replayed
    same = sum(a == b for a, b in zip(tokens, eager_tokens))
    worst = 0.0
    for a, b, la, lb in zip(tokens, eager_tokens, lps, eager_lps):
        agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        worst = max([worst] + [abs(x - y) for x, y in zip(la[:agree], lb[:agree])])
    print("GPU-PIECEWISE", json.dumps({"sequences_equal": same, "of": 12, "max_lp_err": worst}))
    assert same >= 11 and worst < 1e-3
