"""Pooling fixtures: the tiny random Qwen3 with sentence-transformers' pooling files, and a
tiny Qwen3 reranker whose tokenizer has "yes" and "no"."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import Qwen3ForCausalLM

from minivllm.tiny_model import (
    build_tiny_tokenizer,
    tiny_hf_config,
    write_sentence_transformers_files,
)


def pooling_model_dir(base_dir: str, out_dir: str, mode: str, normalize: bool) -> str:
    shutil.copytree(base_dir, out_dir)
    write_sentence_transformers_files(out_dir, mode, normalize)
    return out_dir


@pytest.fixture(scope="session")
def embed_last_dir(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3-Embedding's pooling: last token, normalised."""
    return pooling_model_dir(tiny_qwen3_dir, str(tmp_path_factory.mktemp("e") / "m"), "last", True)


@pytest.fixture(scope="session")
def embed_mean_dir(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return pooling_model_dir(tiny_qwen3_dir, str(tmp_path_factory.mktemp("e") / "m"), "mean", False)


@pytest.fixture(scope="session")
def embed_cls_dir(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return pooling_model_dir(tiny_qwen3_dir, str(tmp_path_factory.mktemp("e") / "m"), "cls", True)


@pytest.fixture(scope="session")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Qwen3 whose tokenizer has "yes" and "no" as tokens (Qwen3-Reranker's)."""
    out = str(tmp_path_factory.mktemp("reranker"))
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(["yes", "no"])
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = tiny_hf_config("Qwen3ForCausalLM", len(tokenizer), eos)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
