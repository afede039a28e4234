"""GPU: the engine (triton backend, bf16, CUDA graphs) against HF transformers on a random-weight
Qwen3-0.6B-shaped model, and CUDA graphs against eager. Run with `pytest -m gpu -s` for figures."""

from __future__ import annotations

import gc
import json
import random

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """Random HF weights with Qwen3-0.6B's shape and a full-vocabulary tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from benchmarks.common import make_dummy_model_dir

    out = make_dummy_model_dir("qwen3-0.6b", str(tmp_path_factory.mktemp("qwen3-0.6b-random")))
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    return out


def prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(2, 150000) for _ in range(length - 13 * i)] for i in range(num)]


def free(llm) -> None:
    llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def test_engine_matches_hf(model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams

    teacher = prompts(4, 512)
    greedy_prompts = prompts(8, 200, seed=1)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    hf_top1 = []
    with torch.no_grad():
        for p in teacher:
            hf_top1.append(hf(torch.tensor([p], device="cuda")).logits[0, :-1].argmax(-1).tolist())
        hf_greedy = [
            hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=64, do_sample=False,
                        min_new_tokens=64)[0, len(p):].tolist()
            for p in greedy_prompts
        ]
    del hf
    torch.cuda.empty_cache()

    llm = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.5, max_model_len=4096)
    assert llm.engine.executor.runner.attn_backend.name == "triton"
    outs = llm.generate([{"prompt_token_ids": p} for p in teacher],
                        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1), use_tqdm=False)
    agree = total = 0
    for out, ref in zip(outs, hf_top1):
        ours = [next(t for t, lp in entry.items() if lp.rank == 1) for entry in out.prompt_logprobs[1:]]
        agree += sum(a == b for a, b in zip(ours, ref))
        total += len(ref)
    gen = llm.generate([{"prompt_token_ids": p} for p in greedy_prompts],
                       SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    prefix = []
    for out, ref in zip(gen, hf_greedy):
        ours = out.outputs[0].token_ids
        n = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ref))
        prefix.append(n / len(ref))
    figures = {"teacher_forced_top1_agreement": round(agree / total, 4), "positions": total,
               "greedy_common_prefix_fraction": [round(x, 3) for x in prefix],
               "mean_greedy_prefix": round(sum(prefix) / len(prefix), 3)}
    print("GPU-PARITY", json.dumps(figures))
    free(llm)
    assert agree / total >= 0.99
    assert sum(prefix) / len(prefix) >= 0.5


def test_cuda_graphs_equal_eager(model_dir: str) -> None:
    from minivllm import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts(12, 100, seed=2)]
    results = {}
    for eager in (True, False):
        llm = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.4, max_model_len=4096,
                  enforce_eager=eager)
        assert (llm.engine.executor.runner.graphs is None) == eager
        results[eager] = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
        free(llm)
    same = sum(a == b for a, b in zip(results[True], results[False]))
    print("GPU-GRAPHS", json.dumps({"sequences_equal": same, "of": len(batch)}))
    assert results[True] == results[False]
