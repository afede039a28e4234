"""The deterministic engine with FP8 weights (quantized at load; the triton backend and GEMMs
in the interpreter), dense and MoE: the same bits alone, batched and chunked; over two ranks."""

from __future__ import annotations

import pytest
from deterministic_engine import DEVICE, PROMPTS
from deterministic_engine import generate_deterministic as _generate
from ordered_dot import ordered_dot, ordered_dot_in_workers  # noqa: F401 (fixtures)

from minivllm.tiny_model import build_tiny_model
from tests.fp8_checkpoint import FP8_MOE_SIZES, FP8_SIZES


@pytest.fixture(scope="module")
def tiny_fp8_ready_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen3 whose projections split into whole 128-row FP8 blocks, also over 2 ranks."""
    out = str(tmp_path_factory.mktemp("tiny-fp8-ready"))
    return build_tiny_model(out, "Qwen3ForCausalLM", **{**FP8_SIZES, "intermediate_size": 256})


@pytest.fixture(scope="module")
def tiny_fp8_ready_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A sparse layer (0) and a dense one (1, mlp_only_layers): both FP8 MLP kinds."""
    out = str(tmp_path_factory.mktemp("tiny-fp8-ready-moe"))
    return build_tiny_model(out, "Qwen3MoeForCausalLM", **FP8_MOE_SIZES, num_hidden_layers=2)


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("model", ["tiny_fp8_ready_dir", "tiny_fp8_ready_moe_dir"])
def test_deterministic_engine_fp8_weights_same_bits(
    model: str, request: pytest.FixtureRequest
) -> None:
    """FP8 weights (quantized at load; activations per token-group), dense and MoE: the same
    bits alone, batched and chunked."""
    model_dir = request.getfixturevalue(model)
    prompts = PROMPTS if model == "tiny_fp8_ready_dir" else PROMPTS[:2]  # MoE: CI's time
    ref = _generate(model_dir, prompts, quantization="fp8")
    assert _generate(model_dir, prompts[:1], quantization="fp8") == ref[:1]
    chunked = _generate(model_dir, prompts, quantization="fp8", max_num_batched_tokens=16)
    assert chunked == ref


@pytest.mark.skipif(DEVICE == "cuda", reason="two ranks over gloo on the CPU")
@pytest.mark.usefixtures("ordered_dot", "ordered_dot_in_workers")
def test_deterministic_engine_fp8_weights_tensor_parallel(tiny_fp8_ready_dir: str) -> None:
    options = {"quantization": "fp8", "tensor_parallel_size": 2}
    ref = _generate(tiny_fp8_ready_dir, PROMPTS, **options)
    assert _generate(tiny_fp8_ready_dir, PROMPTS[:1], **options) == ref[:1]
