"""The deterministic engine (triton backend and GEMMs in the interpreter), dense and MoE: a
request's tokens and logprobs are the same bits alone, in a batch, chunked, and preempted and
recomputed; with tensor parallelism too (two ranks over gloo, the row-parallel sums in rank
order)."""

from __future__ import annotations

import pytest
import torch
from ordered_dot import ordered_dot, ordered_dot_in_workers  # noqa: F401 (fixtures)

from minivllm import LLM, SamplingParams
from minivllm.tiny_model import build_tiny_model
from tests.fp8_checkpoint import FP8_MOE_SIZES, FP8_SIZES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU
PROMPTS = [list(range(3 + i, 3 + i + n)) for i, n in enumerate((29, 7, 18, 41))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)


def _generate(model_dir: str, prompts: list[list[int]], **options) -> list[tuple]:
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


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("model", ["tiny_qwen3_dir", "tiny_qwen3_moe_dir"])
def test_deterministic_engine_same_bits(model: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(model)  # a dense model and a mixture of experts
    ref = _generate(model_dir, PROMPTS)
    assert _generate(model_dir, PROMPTS[:1]) == ref[:1]  # alone
    assert _generate(model_dir, PROMPTS, max_num_batched_tokens=16) == ref  # chunked
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


@pytest.mark.usefixtures("ordered_dot")
# The MoE variant checks its first two prompts alone (an engine start each: CI's time).
@pytest.mark.parametrize(("model", "num_alone"), [("tiny_qwen3_5_dir", len(PROMPTS)),
                                                  ("tiny_qwen3_5_moe_dir", 2)])  # fmt: skip
def test_deterministic_hybrid_engine_same_tokens_alone_and_batched(
    model: str, num_alone: int, request: pytest.FixtureRequest
) -> None:
    """Qwen3.5, dense and MoE: each request's recurrent state is its own, so batching changes
    no token. On the CPU the torch one-token step's batched einsum may round a logprob's last
    bits by batch size (the Triton decode kernel runs one program per request); chunk
    boundaries do change bits (the rule's chunked form and its one-token step round apart)."""
    model_dir = request.getfixturevalue(model)
    ref = _generate(model_dir, PROMPTS)
    alone = [_generate(model_dir, [p])[0] for p in PROMPTS[:num_alone]]
    assert [tokens for tokens, _ in alone] == [tokens for tokens, _ in ref[:num_alone]]
    for (_, ours), (_, expected) in zip(alone, ref[:num_alone], strict=True):
        for entry, ref_entry in zip(ours, expected, strict=True):
            assert [t for t, _ in entry] == [t for t, _ in ref_entry]
            assert [lp for _, lp in entry] == pytest.approx([lp for _, lp in ref_entry], abs=1e-5)


@pytest.fixture(scope="module")
def tiny_fp8_ready_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen3 whose projections split into whole 128-row FP8 blocks, also over 2 ranks."""
    out = str(tmp_path_factory.mktemp("tiny-fp8-ready"))
    return build_tiny_model(out, "Qwen3ForCausalLM", **{**FP8_SIZES, "intermediate_size": 256})


@pytest.fixture(scope="module")
def tiny_fp8_ready_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("tiny-fp8-ready-moe"))
    return build_tiny_model(out, "Qwen3MoeForCausalLM", **FP8_MOE_SIZES)


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("model", ["tiny_fp8_ready_dir", "tiny_fp8_ready_moe_dir"])
def test_deterministic_engine_fp8_weights_same_bits(
    model: str, request: pytest.FixtureRequest
) -> None:
    """FP8 weights (quantized at load; activations per token-group), dense and MoE: the same
    bits alone, batched and chunked."""
    model_dir = request.getfixturevalue(model)
    ref = _generate(model_dir, PROMPTS, quantization="fp8")
    assert _generate(model_dir, PROMPTS[:1], quantization="fp8") == ref[:1]
    chunked = _generate(model_dir, PROMPTS, quantization="fp8", max_num_batched_tokens=16)
    assert chunked == ref


@pytest.mark.skipif(DEVICE == "cuda", reason="two ranks over gloo on the CPU")
@pytest.mark.usefixtures("ordered_dot", "ordered_dot_in_workers")
def test_deterministic_engine_fp8_weights_tensor_parallel(tiny_fp8_ready_dir: str) -> None:
    options = {"quantization": "fp8", "tensor_parallel_size": 2}
    ref = _generate(tiny_fp8_ready_dir, PROMPTS, **options)
    assert _generate(tiny_fp8_ready_dir, PROMPTS[:1], **options) == ref[:1]
