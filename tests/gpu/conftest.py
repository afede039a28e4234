"""GPU test fixtures: a random-weight Qwen3-0.6B-shaped HF checkpoint with sharp logits."""

from __future__ import annotations

import random

import pytest
import torch


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """Random HF weights with Qwen3-0.6B's shape and a full-vocabulary tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from minivllm.tiny_model import make_dummy_model_dir

    out = make_dummy_model_dir("qwen3-0.6b", str(tmp_path_factory.mktemp("qwen3-0.6b-random")))
    cfg = AutoConfig.from_pretrained(out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # Default init makes next-token logits nearly flat (std ~0.6 over 151,936 tokens): the
    # top two differ by less than bf16 rounding, so any two bf16 implementations disagree
    # on ties. Larger embeddings (tied: also the LM head) sharpen them so agreement measures
    # correctness rather than tie-breaking.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    model.save_pretrained(out)
    return out


def prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(2, 150000) for _ in range(length - 7 * i)] for i in range(num)]
