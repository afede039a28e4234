"""The engine with kv_cache_dtype="fp8": option validation, an e4m3 cache with more blocks, the
triton kernels (interpreter) and torch_sdpa reading the same cache bytes, and greedy tokens
against the model-dtype cache."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig

PROMPTS = [[5, 17, 42, 99, 3, 8, 1, 2], list(range(20, 57))]
GEN = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _run(model_dir: str, backend: str, kv_cache_dtype: str, **options) -> tuple[LLM, list]:
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4, attention_backend=backend,
              kv_cache_memory=1 << 20, kv_cache_dtype=kv_cache_dtype, **options)  # fmt: skip
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    scored = llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)
    generated = llm.generate(prompts, GEN, use_tqdm=False)
    return llm, [scored, generated]


def _chosen_logprobs(outputs) -> torch.Tensor:
    """The logprob each prompt position gave the prompt's next token."""
    values = []
    for out in outputs:
        for token, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
            values.append(entry[token].logprob)
    return torch.tensor(values)


def test_config_accepts_fp8_names_and_rejects_others(tiny_qwen3_dir: str) -> None:
    for name in ("auto", "fp8", "fp8_e4m3"):
        assert EngineConfig(tiny_qwen3_dir, kv_cache_dtype=name).kv_cache_dtype == name
    assert (
        EngineConfig(tiny_qwen3_dir, kv_cache_dtype="fp8_e4m3").resolved_kv_cache_dtype(
            torch.bfloat16
        )
        == torch.float8_e4m3fn
    )
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto|fp8|fp8_e4m3"):
        EngineConfig(tiny_qwen3_dir, kv_cache_dtype="fp8_e5m2")


def test_fp8_engine_triton_and_sdpa_agree(tiny_qwen3_dir: str) -> None:
    base_llm, (base_scored, base_gen) = _run(tiny_qwen3_dir, "torch_sdpa", "auto")
    base_blocks = base_llm.engine.executor.runner.kv_caches[0].shape[1]
    runs = {}
    # "deterministic": the triton backend's batch-invariant kernel.
    for name, backend in (("torch_sdpa",) * 2, ("triton",) * 2, ("deterministic", "triton")):
        llm, runs[name] = _run(tiny_qwen3_dir, backend, "fp8", deterministic=name != backend)
        cache = llm.engine.executor.runner.kv_caches[0]
        assert cache.dtype == torch.float8_e4m3fn
        # 1 byte an element instead of float32's 4: four times the blocks in the same budget.
        assert cache.shape[1] == 4 * base_blocks
    # Both backends store the same e4m3 bytes and dequantize them alike.
    sdpa = _chosen_logprobs(runs["torch_sdpa"][0])
    tokens = [o.outputs[0].token_ids for o in runs["torch_sdpa"][1]]
    for name in ("triton", "deterministic"):
        torch.testing.assert_close(_chosen_logprobs(runs[name][0]), sdpa, atol=1e-4, rtol=1e-4)
        assert [o.outputs[0].token_ids for o in runs[name][1]] == tokens
    # e4m3 keeps 3 mantissa bits (about 3 % per element): the logprobs move by a few
    # hundredths (measured: mean 0.027, max 0.10), and the greedy tokens stay.
    fp8_error = (sdpa - _chosen_logprobs(base_scored)).abs()
    assert 0 < fp8_error.mean() < 0.05 and fp8_error.max() < 0.25, fp8_error
    assert tokens == [o.outputs[0].token_ids for o in base_gen]
