"""The whole engine with the triton backend (Triton interpreter on the CPU) gives the same
greedy tokens as the torch_sdpa reference, through chunked prefill, prefix hits and decodes."""

from __future__ import annotations

from minivllm import LLM, SamplingParams

PROMPTS = [
    {"prompt_token_ids": list(range(30, 50)) + [7]},
    {"prompt_token_ids": list(range(30, 50)) + [9, 4]},
    {"prompt_token_ids": [5, 6, 7]},
]
PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def greedy(model_dir: str, backend: str) -> list[list[int]]:
    llm = LLM(
        model_dir,
        dtype="float32",
        device="cpu",
        block_size=8,
        max_num_batched_tokens=16,
        attention_backend=backend,
    )
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def test_triton_engine_matches_sdpa(tiny_qwen3_dir: str) -> None:
    assert greedy(tiny_qwen3_dir, "triton") == greedy(tiny_qwen3_dir, "torch_sdpa")
