"""Pooling fixtures: the tiny random Qwen3 with sentence-transformers' pooling files, and a
tiny Qwen3 reranker whose tokenizer has "yes" and "no"."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from transformers import Qwen3ForCausalLM

from minivllm.tiny_model import build_tiny_tokenizer, tiny_hf_config


def write_sentence_transformers_files(model_dir: str, mode: str, normalize: bool) -> None:
    """modules.json (Transformer, Pooling, Normalize where asked) and the Pooling config, as
    sentence-transformers saves them (legacy bool keys, which every version reads)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
        os.makedirs(os.path.join(model_dir, "2_Normalize"), exist_ok=True)
    with open(os.path.join(model_dir, "modules.json"), "w") as f:
        json.dump(modules, f)
    hidden = json.load(open(os.path.join(model_dir, "config.json")))["hidden_size"]
    pooling = {"word_embedding_dimension": hidden, "include_prompt": True}
    for key, name in (("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean"),
                      ("pooling_mode_cls_token", "cls")):  # fmt: skip
        pooling[key] = mode == name
    os.makedirs(os.path.join(model_dir, "1_Pooling"), exist_ok=True)
    with open(os.path.join(model_dir, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f)
    with open(os.path.join(model_dir, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 512, "do_lower_case": False}, f)


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
