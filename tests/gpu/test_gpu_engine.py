"""GPU: the engine (triton backend, bf16, CUDA graphs) against HF transformers on a random-weight
Qwen3-0.6B-shaped model, and CUDA graphs against eager. Run with `pytest -m gpu -s` for figures."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from tests.gpu.conftest import prompts  # noqa: F401  (shared with the TP test)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_engine_matches_hf(model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams

    teacher = prompts(4, 512)
    greedy_prompts = prompts(8, 200, seed=1)
    top1 = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda()
        with torch.no_grad():
            top1[name] = [
                hf(torch.tensor([p], device="cuda")).logits[0, :-1].argmax(-1).tolist()
                for p in teacher
            ]
            if name == "bf16":
                hf_greedy = [
                    hf.generate(
                        torch.tensor([p], device="cuda"),
                        max_new_tokens=64,
                        do_sample=False,
                        min_new_tokens=64,
                    )[0, len(p) :].tolist()
                    for p in greedy_prompts
                ]
        del hf
        torch.cuda.empty_cache()

    llm = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.5, max_model_len=4096)
    try:
        assert llm.engine.executor.runner.attn_backend.name == "triton"
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in teacher],
            SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
            use_tqdm=False,
        )
        ours = [
            [
                next(t for t, lp in entry.items() if lp.rank == 1)
                for entry in out.prompt_logprobs[1:]
            ]
            for out in outs
        ]

        def agreement(a: list[list[int]], b: list[list[int]]) -> float:
            pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
            return sum(x == y for x, y in pairs) / len(pairs)

        gen = llm.generate(
            [{"prompt_token_ids": p} for p in greedy_prompts],
            SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True),
            use_tqdm=False,
        )
        prefix = []
        for out, ref in zip(gen, hf_greedy):
            tokens = out.outputs[0].token_ids
            n = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), len(ref))
            prefix.append(n / len(ref))
        figures = {
            "top1_ours_vs_hf_bf16": round(agreement(ours, top1["bf16"]), 4),
            "top1_ours_vs_hf_fp32": round(agreement(ours, top1["fp32"]), 4),
            "top1_hf_bf16_vs_hf_fp32": round(agreement(top1["bf16"], top1["fp32"]), 4),
            "positions": sum(map(len, ours)),
            "greedy_common_prefix_fraction": [round(x, 3) for x in prefix],
            "mean_greedy_prefix": round(sum(prefix) / len(prefix), 3),
        }
        print("GPU-PARITY", json.dumps(figures))
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    # Measured floor: HF bf16 itself agrees with HF fp32 on only ~97 % of positions of this
    # random model (near-tied logits), so ours is held to that floor against the fp32 truth.
    assert figures["top1_ours_vs_hf_fp32"] >= figures["top1_hf_bf16_vs_hf_fp32"] - 0.01
    assert sum(prefix) / len(prefix) >= 0.5


def generate_tokens(model_dir: str, batch: list[dict], params, **options) -> tuple[list, bool]:
    """Greedy tokens of a fresh LLM (bf16) and whether its runner captured CUDA graphs."""
    from minivllm import LLM

    llm = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.3, **options)
    try:
        outs = llm.generate(batch, params, use_tqdm=False)
        tokens = [o.outputs[0].token_ids for o in outs]
        # Plain values only: a `runner` local would keep the KV cache alive through the
        # gc.collect() below (the next LLM's profiling would find its memory in use).
        backend = llm.engine.executor.runner.attn_backend.name
        captured = llm.engine.executor.runner.graphs is not None
        del outs
        assert backend == options.get("attention_backend", "triton")
        return tokens, captured
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


def test_cuda_graphs_equal_eager(model_dir: str) -> None:
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts(12, 100, seed=2)]
    results = {}
    for eager in (True, False):
        results[eager], graphs = generate_tokens(
            model_dir, batch, params, max_model_len=4096, enforce_eager=eager
        )
        assert graphs != eager
    same = sum(a == b for a, b in zip(results[True], results[False]))
    print("GPU-GRAPHS", json.dumps({"sequences_equal": same, "of": len(batch)}))
    assert results[True] == results[False]


def test_torch_sdpa_backend_runs_eagerly_on_cuda(model_dir: str) -> None:
    """torch_sdpa cannot be captured (it loops over requests on the host): on CUDA the runner
    runs it without graphs (capturing it used to crash), with the tokens of an eager run."""
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts(4, 60, seed=3)]
    options = dict(max_model_len=1024, attention_backend="torch_sdpa")
    eager, _ = generate_tokens(model_dir, batch, params, enforce_eager=True, **options)
    default, graphs = generate_tokens(model_dir, batch, params, **options)
    assert not graphs and all(len(t) == 16 for t in default)
    assert default == eager


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_engine_frees_gpu_memory(model_dir: str, deterministic: bool) -> None:
    """After shutdown + del + gc the runner (CUDA graphs, KV cache) is gone and the memory is
    back: a second LLM in the process must find the whole budget free."""
    import weakref

    from minivllm import LLM, SamplingParams

    before = torch.cuda.memory_allocated()
    llm = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.3, deterministic=deterministic)
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=2)
    outs = llm.generate([{"prompt_token_ids": list(range(5, 40))}], params, use_tqdm=False)
    ref = weakref.ref(llm.engine.executor.runner)
    llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    assert ref() is None, [type(r) for r in gc.get_referrers(ref())]
    assert outs[0].outputs[0].token_ids  # the outputs outlive the engine
    left = torch.cuda.memory_allocated() - before
    print(f"\nGPU-memory after freeing ({deterministic=}): {left / 2**20:.1f} MiB still allocated")
    assert left < 256 * 2**20
