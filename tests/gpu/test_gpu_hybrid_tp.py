"""GPU, two cards: the hybrid models under tensor parallelism (NCCL, the Triton gated-delta and
conv kernels on each rank's heads, decode CUDA graphs with the state slots and the all-reduce
captured). The tiny Qwen3.5, Qwen3.5-MoE and Qwen3-Next in float32 at TP=2 give HF's float32
argmax and TP=1's tokens, batched, alone, chunked and on a chat turn's prefix-cache hit; a
mid-size Qwen3.5 in bf16 (128-dim linear-attention heads, 4 key heads a rank) agrees with
TP=1 on most tokens."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_gpu_qwen3_5 import PROMPTS, _assert_matches_hf, _generate, _mid_model_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

MAX_TOKENS = 16


def _session(model_dir: str, tp: int, dtype: str, **options) -> tuple[list, list, int]:
    """PROMPTS batched, each alone, then the next turn of a chat on PROMPTS[1]: (the prompts,
    their completions, the turn's cached tokens)."""
    from minivllm import LLM, SamplingParams

    llm = LLM(model_dir, dtype=dtype, gpu_memory_utilization=0.3, tensor_parallel_size=tp,
              max_model_len=2048, **options)  # fmt: skip
    try:
        completions = _generate(llm, PROMPTS, MAX_TOKENS)
        completions += [_generate(llm, [p], MAX_TOKENS)[0] for p in PROMPTS]
        turn = PROMPTS[1] + list(completions[1].token_ids) + [8, 9, 10]
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
        hit = llm.generate([{"prompt_token_ids": turn}], params, use_tqdm=False)[0]
    finally:
        llm.shutdown()
    return [*PROMPTS, *PROMPTS, turn], [*completions, hit.outputs[0]], hit.num_cached_tokens


@pytest.mark.parametrize(
    "architecture", ["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM"]
)
@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 40}], ids=["graphs", "chunked"])
def test_tiny_float32_tp2_matches_hf_and_tp1(tmp_path, architecture: str, options: dict) -> None:
    from transformers import AutoModelForCausalLM

    from minivllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(str(tmp_path / "model"), architecture)
    prompts, split, cached = _session(model_dir, 2, "float32", **options)
    _, whole, whole_cached = _session(model_dir, 1, "float32", **options)
    assert cached == whole_cached and cached > 0
    assert [c.token_ids for c in split] == [c.token_ids for c in whole]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    _assert_matches_hf(hf, prompts, split)


def test_mid_size_bf16_tp2_agrees_with_tp1(tmp_path) -> None:
    """bf16: the all-reduce sums the ranks' halves in another order than one GPU's GEMM; at
    least 90% of the tokens agree, and every completion's first."""
    model_dir = _mid_model_dir(str(tmp_path / "q35-mid"))
    _, split, _ = _session(model_dir, 2, "bfloat16")
    _, whole, _ = _session(model_dir, 1, "bfloat16")
    agree = total = 0
    for a, b in zip(split, whole, strict=True):
        assert a.token_ids[0] == b.token_ids[0]
        agree += sum(x == y for x, y in zip(a.token_ids, b.token_ids))
        total += len(a.token_ids)
    assert agree / total >= 0.9, f"{agree}/{total} tokens agree"
