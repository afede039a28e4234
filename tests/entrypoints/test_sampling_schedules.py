"""Sampling that reads the output so far (penalties, min_tokens) and logprobs give the same
tokens and logprobs whether steps run ahead (async scheduling, the penalty tables counting
on the device) or one by one, with chunked prefill and preemption changing the schedule."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams

PROMPTS = [list(range(30, 70)), [9, 8, 7, 6, 5, 4, 3, 2, 1], list(range(100, 117)), [5, 5, 5]]
PARAMS = [
    SamplingParams(temperature=0.8, top_k=20, top_p=0.8, repetition_penalty=1.3, seed=7,
                   max_tokens=12, ignore_eos=True, logprobs=3),
    SamplingParams(temperature=0.0, presence_penalty=0.6, frequency_penalty=0.4, max_tokens=12,
                   ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0.0, repetition_penalty=2.0, min_tokens=8, max_tokens=12),
    SamplingParams(temperature=1.0, top_p=0.9, frequency_penalty=1.5, seed=3, max_tokens=12,
                   ignore_eos=True),
]  # fmt: skip


def run(model_dir: str, **options):
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4, **options)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    llm.shutdown()
    return [
        (o.outputs[0].token_ids, [sorted(e.items()) for e in (o.outputs[0].logprobs or [])])
        for o in outs
    ]


def hf_penalized_greedy(model_dir: str, prompt: list[int], p: SamplingParams) -> list[int]:
    """Greedy tokens under p's penalties, from HF transformers' logits, written out."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    output: list[int] = []
    with torch.no_grad():
        for _ in range(p.max_tokens):
            logits = model(torch.tensor([prompt + output])).logits[0, -1]
            for token in set(prompt + output):
                x = logits[token]
                r = p.repetition_penalty
                logits[token] = x / r if x > 0 else x * r
            for token in set(output):
                logits[token] -= p.frequency_penalty * output.count(token) + p.presence_penalty
            output.append(int(logits.argmax()))
    return output


@pytest.fixture(scope="module")
def reference(tiny_qwen3_dir: str):
    model_dir = tiny_qwen3_dir
    result = run(model_dir, async_scheduling=False)
    tokens = [t for t, _ in result]
    # The penalties change the tokens, and as HF's logits penalized by hand do.
    plain = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    unpenalized = plain.generate(
        [{"prompt_token_ids": PROMPTS[1]}],
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        use_tqdm=False,
    )
    plain.shutdown()
    assert unpenalized[0].outputs[0].token_ids != tokens[1]
    assert tokens[1] == hf_penalized_greedy(model_dir, PROMPTS[1], PARAMS[1])
    assert tokens[2][:8] == hf_penalized_greedy(
        model_dir, PROMPTS[2], SamplingParams(repetition_penalty=2.0, max_tokens=8)
    )
    assert len(tokens[2]) >= 8
    return result


def assert_same(got, want) -> None:
    """The same tokens and top logprob ids and ranks; logprob values within float noise (a
    schedule that batches rows differently changes the last bits of the logits)."""
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, got_lps), (_, want_lps) in zip(got, want, strict=True):
        assert len(got_lps) == len(want_lps)
        for got_entry, want_entry in zip(got_lps, want_lps, strict=True):
            assert [i for i, _ in got_entry] == [i for i, _ in want_entry]
            for (_, a), (_, b) in zip(got_entry, want_entry, strict=True):
                assert abs(a.logprob - b.logprob) < 1e-5 and a.rank == b.rank


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_num_batched_tokens": 7, "num_gpu_blocks_override": 18, "max_num_seqs": 3},
    ],
    ids=["plain", "chunked-preempt"],
)
def test_async_steps_sample_as_sync_steps(tiny_qwen3_dir: str, reference, options) -> None:
    result = run(tiny_qwen3_dir, async_scheduling=True, **options)
    if not options:  # the same batches step by step: the same bits
        assert result == reference
    assert_same(result, reference)
    if options:
        assert_same(run(tiny_qwen3_dir, async_scheduling=False, **options), reference)
