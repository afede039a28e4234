"""The deterministic engine on hybrid models (Qwen3.5, dense and MoE; the triton backend and
GEMMs in the interpreter): the same tokens alone and batched."""

from __future__ import annotations

import pytest
from deterministic_engine import PROMPTS
from deterministic_engine import generate_deterministic as _generate
from ordered_dot import ordered_dot, ordered_dot_in_workers  # noqa: F401 (fixtures)


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
