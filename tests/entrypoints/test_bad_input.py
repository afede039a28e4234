"""Bad input gets a clear error naming the problem, and the same LLM keeps serving."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str) -> LLM:
    return LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        block_size=4,
        max_model_len=64,
        num_gpu_blocks_override=12,
    )


def still_serves(llm: LLM) -> None:
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, GREEDY, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.num_blocks


def test_prompt_too_long(llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"70 tokens.*max_model_len is 64"):
        llm.generate({"prompt_token_ids": [1] * 70}, GREEDY, use_tqdm=False)
    still_serves(llm)


def test_empty_prompt(llm: LLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", GREEDY, use_tqdm=False)
    still_serves(llm)


def test_token_outside_vocab(llm: LLM) -> None:
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(ValueError, match=str(vocab + 5)):
        llm.generate(
            [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [1, vocab + 5]}],
            GREEDY,
            use_tqdm=False,
        )
    with pytest.raises(ValueError, match="-1"):
        llm.generate({"prompt_token_ids": [-1]}, GREEDY, use_tqdm=False)
    still_serves(llm)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_invalid_sampling_params(kwargs, words) -> None:
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_never_fits_in_kv_cache(llm: LLM) -> None:
    # 12 blocks of 4 = 48 tokens; 40 + 20 can never fit, even alone.
    with pytest.raises(ValueError, match="KV"):
        llm.generate({"prompt_token_ids": [1] * 40}, SamplingParams(max_tokens=20), use_tqdm=False)
    still_serves(llm)


def test_max_model_len_stops_with_length(tiny_qwen3_dir: str) -> None:
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4, max_model_len=48)
    params = SamplingParams(max_tokens=None, ignore_eos=True, temperature=0.0)
    out = llm.generate({"prompt_token_ids": [1] * 40}, params, use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "length"
    assert len(out[0].outputs[0].token_ids) == 8


def test_unknown_option(tiny_qwen3_dir: str) -> None:
    with pytest.raises(TypeError, match="max_num_sequences"):
        LLM(tiny_qwen3_dir, max_num_sequences=4)


def test_missing_model_dir(tmp_path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError, match="nope"):
        LLM(missing)


def test_unsupported_architecture(tiny_qwen3_dir: str, tmp_path) -> None:
    target = tmp_path / "weird"
    shutil.copytree(tiny_qwen3_dir, target)
    cfg = json.loads((target / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (target / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"MambaForCausalLM.*Qwen3ForCausalLM"):
        LLM(str(target), device="cpu")


def test_missing_weights(tiny_qwen3_dir: str, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    target = tmp_path / "missing"
    shutil.copytree(tiny_qwen3_dir, target)
    tensors = load_file(str(target / "model.safetensors"))
    del tensors["model.layers.0.mlp.down_proj.weight"]
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.layers.0.mlp.down_proj.weight"):
        LLM(str(target), device="cpu")


def test_truncated_checkpoint(tiny_qwen3_dir: str, tmp_path) -> None:
    target = tmp_path / "truncated"
    shutil.copytree(tiny_qwen3_dir, target)
    path = target / "model.safetensors"
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ValueError, match="model.safetensors"):
        LLM(str(target), device="cpu")
