"""GPU test fixtures: a random-weight Qwen3-0.6B-shaped HF checkpoint with sharp logits; a skip
where a Gluon kernel cannot run."""

from __future__ import annotations

import pytest

from minivllm.tiny_model import parity_prompts as prompts  # noqa: F401  (the tests import it)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """Random HF weights with Qwen3-0.6B's shape, sharpened logits and a full-vocabulary
    tokenizer (minivllm.tiny_model.make_parity_model_dir)."""
    from minivllm.tiny_model import make_parity_model_dir

    return make_parity_model_dir("qwen3-0.6b", str(tmp_path_factory.mktemp("qwen3-0.6b-random")))


def skip_unless_supported(module) -> None:
    """Skips the test where a Gluon kernel module's `supports` refuses bf16 on this GPU (not
    Hopper, or no Gluon in this triton)."""
    import torch

    probe = torch.empty(1, 2, 128, dtype=torch.bfloat16, device="cuda")
    cache = torch.empty(2, 1, 16, 1, 128, dtype=torch.bfloat16, device="cuda")
    if not module.supports(probe, cache):
        pytest.skip(f"needs Hopper and Gluon (import error: {module.GLUON_IMPORT_ERROR})")
