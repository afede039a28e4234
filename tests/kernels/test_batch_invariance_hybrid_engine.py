"""The deterministic engine on a hybrid model (Qwen3.5; the triton backend and GEMMs in the
interpreter): the same tokens alone and batched."""

from __future__ import annotations

import pytest
from deterministic_engine import PROMPTS, generate_each_alone
from deterministic_engine import generate_deterministic as _generate
from ordered_dot import ordered_dot, ordered_dot_in_workers  # noqa: F401 (fixtures)


@pytest.mark.usefixtures("ordered_dot")
def test_deterministic_hybrid_engine_same_tokens_alone_and_batched(tiny_qwen3_5_dir: str) -> None:
    """Qwen3.5: each request's recurrent state is its own, so batching changes
    no token. On the CPU the torch one-token step's batched einsum may round a logprob's last
    bits by batch size (the Triton decode kernel runs one program per request); chunk
    boundaries do change bits (the rule's chunked form and its one-token step round apart).
    (The MoE variant's experts are invariant as Qwen3-MoE's: test_batch_invariance_engine.py;
    on the GPU, tests/gpu/test_gpu_qwen3_5_moe.py runs it deterministic.)"""
    ref = _generate(tiny_qwen3_5_dir, PROMPTS)
    alone = generate_each_alone(tiny_qwen3_5_dir, PROMPTS)
    assert [tokens for tokens, _ in alone] == [tokens for tokens, _ in ref]
    for (_, ours), (_, expected) in zip(alone, ref, strict=True):
        for entry, ref_entry in zip(ours, expected, strict=True):
            assert [t for t, _ in entry] == [t for t, _ in ref_entry]
            assert [lp for _, lp in entry] == pytest.approx([lp for _, lp in ref_entry], abs=1e-5)
