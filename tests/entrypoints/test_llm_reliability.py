"""LLM under faults and misuse: text at a cut character, threads, interrupts, bad requests."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str) -> LLM:
    return LLM(
        tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=64
    )


def test_text_equals_decoded_output_ids(llm: LLM) -> None:
    """Sampled outputs often end inside a multi-byte character; the text must still be the
    decoded ids (at seed 1 it was "" for 136 of 200 such requests)."""
    prompts = [f"Hello {i}" for i in range(100)]
    params = SamplingParams(temperature=0.8, max_tokens=8, seed=1)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    eos = set(llm.generation_defaults.eos_token_ids)
    num_cut = 0
    for out in outputs:
        completion = out.outputs[0]
        token_ids = completion.token_ids
        if completion.finish_reason == "stop" and token_ids and token_ids[-1] in eos:
            token_ids = token_ids[:-1]
        expected = llm.tokenizer.decode(token_ids, skip_special_tokens=True)
        assert completion.text == expected
        num_cut += expected.endswith("\ufffd")
    assert num_cut > 0  # the case under test happened
