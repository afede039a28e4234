"""The deterministic engine (triton backend and GEMMs in the interpreter), dense and MoE: a
request's tokens and logprobs are the same bits alone, in a batch, chunked, and preempted and
recomputed; with tensor parallelism too (two ranks over gloo, the row-parallel sums in rank
order). FP8 weights and hybrid models: test_batch_invariance_fp8_engine.py, _hybrid_engine.py."""

from __future__ import annotations

import pytest
from deterministic_engine import DEVICE, PROMPTS
from deterministic_engine import generate_deterministic as _generate
from ordered_dot import ordered_dot, ordered_dot_in_workers  # noqa: F401 (fixtures)

from minivllm import LLM


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("model", ["tiny_qwen3_dir", "tiny_qwen3_moe_dir"])
def test_deterministic_engine_same_bits(model: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(model)  # a dense model and a mixture of experts
    ref = _generate(model_dir, PROMPTS)
    assert _generate(model_dir, PROMPTS[:1]) == ref[:1]  # alone
    assert _generate(model_dir, PROMPTS, max_num_batched_tokens=16) == ref  # chunked
    if model == "tiny_qwen3_dir":  # (MoE: the chunked run covers a recompute's shapes; CI time)
        # 12 blocks of 8 hold the longest request but not all four: preemption and recompute.
        assert _generate(model_dir, PROMPTS, num_gpu_blocks_override=12) == ref


@pytest.mark.skipif(
    DEVICE == "cuda",
    reason="on GPUs: benchmarks/checks/determinism_check.py --tensor-parallel-size 2 (two GPUs)",
)
@pytest.mark.usefixtures("ordered_dot", "ordered_dot_in_workers")
def test_deterministic_engine_same_bits_tensor_parallel(tiny_qwen3_dir: str) -> None:
    ref = _generate(tiny_qwen3_dir, PROMPTS, tensor_parallel_size=2)
    assert _generate(tiny_qwen3_dir, PROMPTS[:1], tensor_parallel_size=2) == ref[:1]
    chunked = _generate(tiny_qwen3_dir, PROMPTS, tensor_parallel_size=2, max_num_batched_tokens=16)
    assert chunked == ref
    preempted = _generate(
        tiny_qwen3_dir, PROMPTS, tensor_parallel_size=2, num_gpu_blocks_override=12
    )
    assert preempted == ref


def test_deterministic_needs_the_triton_backend(tiny_qwen3_dir: str) -> None:
    with pytest.raises(ValueError, match="deterministic"):
        LLM(tiny_qwen3_dir, device="cpu", attention_backend="torch_sdpa", deterministic=True)
