"""LLM.generate against HF transformers: greedy tokens equal, batched and one at a time."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams

PROMPTS = [[5, 17, 42, 99, 3], [7] * 13 + [8, 9], [100, 200, 300], list(range(20, 57))]
MAX_TOKENS = 12


def hf_greedy(model_dir: str, prompt: list[int], max_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_tokens,
        do_sample=False,
        min_new_tokens=max_tokens,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch_fixture", ["tiny_qwen3_dir", "tiny_qwen2_dir", "tiny_llama_dir"])
def test_greedy_tokens_equal_hf(arch_fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(arch_fixture)
    expected = [hf_greedy(model_dir, p, MAX_TOKENS) for p in PROMPTS]
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    batched = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in batched] == expected
    for prompt, want in zip(PROMPTS, expected):
        alone = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
        assert alone[0].outputs[0].token_ids == want
        assert alone[0].prompt_token_ids == prompt
        assert alone[0].finished and alone[0].outputs[0].finish_reason == "length"
