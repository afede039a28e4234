"""GPU test fixtures: a random-weight Qwen3-0.6B-shaped HF checkpoint with sharp logits."""

from __future__ import annotations

import random

import pytest


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """Random HF weights with Qwen3-0.6B's shape, sharpened logits and a full-vocabulary
    tokenizer (minivllm.tiny_model.make_parity_model_dir)."""
    from minivllm.tiny_model import make_parity_model_dir

    return make_parity_model_dir("qwen3-0.6b", str(tmp_path_factory.mktemp("qwen3-0.6b-random")))


def prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(2, 150000) for _ in range(length - 7 * i)] for i in range(num)]
