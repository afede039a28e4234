"""GPU test fixtures: a random-weight Qwen3-0.6B-shaped HF checkpoint with sharp logits."""

from __future__ import annotations

import pytest

from minivllm.tiny_model import parity_prompts as prompts  # noqa: F401  (the tests import it)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """Random HF weights with Qwen3-0.6B's shape, sharpened logits and a full-vocabulary
    tokenizer (minivllm.tiny_model.make_parity_model_dir)."""
    from minivllm.tiny_model import make_parity_model_dir

    return make_parity_model_dir("qwen3-0.6b", str(tmp_path_factory.mktemp("qwen3-0.6b-random")))
