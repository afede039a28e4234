"""Weight loading: sharded vs single checkpoints, missing/corrupt files, dummy weights, ties."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.model_loader import build_model, load_dummy_weights, load_model
from minivllm.models.model_config import ModelConfig
from minivllm.tiny_model import build_tiny_model


def make_model(model_dir: str, load_format: str = "auto", dtype: torch.dtype = torch.float32):
    config = ModelConfig.from_hf(model_dir)
    return build_model(config, TorchSDPABackend(), dtype, "cpu", model_dir, load_format)


def copy_config(src_dir: str, dst_dir: str) -> str:
    os.makedirs(dst_dir, exist_ok=True)
    shutil.copy(os.path.join(src_dir, "config.json"), dst_dir)
    return dst_dir


def write_sharded(state: dict[str, torch.Tensor], out_dir: str, num_shards: int) -> None:
    names = sorted(state)
    weight_map = {}
    for shard in range(num_shards):
        file_name = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {name: state[name] for name in names[shard::num_shards]}
        save_file(part, os.path.join(out_dir, file_name))
        weight_map.update(dict.fromkeys(part, file_name))
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_sharded_checkpoint_equals_single(tiny_qwen2_dir: str, tmp_path) -> None:
    state = load_file(os.path.join(tiny_qwen2_dir, "model.safetensors"))
    sharded_dir = copy_config(tiny_qwen2_dir, str(tmp_path / "sharded"))
    write_sharded(state, sharded_dir, num_shards=3)
    single, sharded = make_model(tiny_qwen2_dir), make_model(sharded_dir)
    sharded_params = dict(sharded.named_parameters())
    for name, param in single.named_parameters():
        torch.testing.assert_close(sharded_params[name], param, rtol=0, atol=0)
    # Packed parameters hold the checkpoint's pieces in order.
    qkv = single.model.layers[0].self_attn.qkv_proj.bias
    expected = torch.cat([state[f"model.layers.0.self_attn.{p}_proj.bias"] for p in "qkv"])
    torch.testing.assert_close(qkv, expected, rtol=0, atol=0)


def test_missing_weights_are_all_listed(tiny_qwen3_dir: str, tmp_path) -> None:
    state = load_file(os.path.join(tiny_qwen3_dir, "model.safetensors"))
    removed = [
        "model.layers.1.mlp.up_proj.weight",
        "model.norm.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ]
    for name in removed:
        del state[name]
    model_dir = copy_config(tiny_qwen3_dir, str(tmp_path / "missing"))
    save_file(state, os.path.join(model_dir, "model.safetensors"))
    with pytest.raises(ValueError) as error:
        make_model(model_dir)
    for name in removed:
        assert name in str(error.value)
    assert "3 weight(s) missing" in str(error.value)


def test_unexpected_and_misshaped_tensors_are_errors(tiny_qwen3_dir: str, tmp_path) -> None:
    state = load_file(os.path.join(tiny_qwen3_dir, "model.safetensors"))
    model_dir = copy_config(tiny_qwen3_dir, str(tmp_path / "bad"))
    path = os.path.join(model_dir, "model.safetensors")
    save_file({**state, "model.layers.0.mlp.extra.weight": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=r"no model parameter.*mlp\.extra\.weight"):
        make_model(model_dir)
    state["model.layers.1.self_attn.o_proj.weight"] = torch.zeros(3, 3)
    save_file(state, path)
    with pytest.raises(ValueError, match=r"o_proj\.weight.*\(3, 3\)"):
        make_model(model_dir)


def test_truncated_file_names_the_file(tiny_qwen3_dir: str, tmp_path) -> None:
    model_dir = copy_config(tiny_qwen3_dir, str(tmp_path / "truncated"))
    with open(os.path.join(tiny_qwen3_dir, "model.safetensors"), "rb") as f:
        data = f.read()
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated/model.safetensors"):
        make_model(model_dir)


def test_no_safetensors_names_the_directory(tiny_qwen3_dir: str, tmp_path) -> None:
    model_dir = copy_config(tiny_qwen3_dir, str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no \\*.safetensors files.*empty"):
        make_model(model_dir)


def test_dummy_weights_fill_everything_deterministically(tiny_qwen3_dir: str) -> None:
    model = make_model(tiny_qwen3_dir, load_format="dummy")
    for param in model.parameters():
        param.data.fill_(float("nan"))
    load_dummy_weights(model, seed=3)
    first = {name: p.clone() for name, p in model.named_parameters()}
    assert not any(p.isnan().any() for p in first.values())
    assert (first["model.norm.weight"] == 1).all()
    assert (first["model.layers.0.self_attn.q_norm.weight"] == 1).all()
    assert 0.01 < first["model.layers.0.mlp.down_proj.weight"].std() < 0.03
    load_dummy_weights(model, seed=3)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, first[name], rtol=0, atol=0)
    load_dummy_weights(model, seed=4)
    assert not torch.equal(model.model.embed_tokens.weight, first["model.embed_tokens.weight"])


def test_tied_and_untied_embeddings(tiny_qwen3_dir: str, tmp_path) -> None:
    tied = make_model(tiny_qwen3_dir)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    untied_dir = build_tiny_model(str(tmp_path / "untied"), tie_word_embeddings=False)
    state = load_file(os.path.join(untied_dir, "model.safetensors"))
    untied = make_model(untied_dir)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    vocab = untied.config.vocab_size
    torch.testing.assert_close(untied.lm_head.weight[:vocab], state["lm_head.weight"])
    torch.testing.assert_close(
        untied.model.embed_tokens.weight[:vocab], state["model.embed_tokens.weight"]
    )
    # A tied checkpoint that still stores lm_head.weight loads (the copy is ignored).
    state = load_file(os.path.join(tiny_qwen3_dir, "model.safetensors"))
    state["lm_head.weight"] = torch.zeros_like(state["model.embed_tokens.weight"])
    model_dir = copy_config(tiny_qwen3_dir, str(tmp_path / "tied-extra"))
    save_file(state, os.path.join(model_dir, "model.safetensors"))
    load_model(tied, model_dir)
    torch.testing.assert_close(tied.lm_head.weight[:vocab], state["model.embed_tokens.weight"])


def test_checkpoint_dtype_is_cast(tiny_llama_dir: str, tmp_path) -> None:
    state = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))
    model_dir = copy_config(tiny_llama_dir, str(tmp_path / "bf16"))
    save_file(
        {k: v.to(torch.bfloat16) for k, v in state.items()},
        os.path.join(model_dir, "w.safetensors"),
    )
    model = make_model(model_dir, dtype=torch.float32)
    weight = model.model.layers[1].mlp.down_proj.weight
    assert weight.dtype == torch.float32
    torch.testing.assert_close(
        weight, state["model.layers.1.mlp.down_proj.weight"].to(torch.bfloat16).float()
    )


def test_tiny_tokenizer_and_config(tiny_qwen3_dir: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    config = ModelConfig.from_hf(tiny_qwen3_dir)
    assert len(tokenizer) <= config.vocab_size
    assert config.architecture == "Qwen3ForCausalLM" and config.tie_word_embeddings
    text = "Héllo, wörld! 日本語 \t\n😀"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text and max(ids) < config.vocab_size
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id in config.eos_token_ids
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer("<|im_end|>")["input_ids"] == [im_end]
    with open(os.path.join(tiny_qwen3_dir, "generation_config.json")) as f:
        assert im_end in json.load(f)["eos_token_id"]


def test_default_tiny_model_dir_is_built_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minivllm.tiny_model import default_tiny_model_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    model_dir = default_tiny_model_dir()
    assert model_dir.startswith(str(tmp_path)) and model_dir.endswith("tiny-qwen3")
    weights = os.path.join(model_dir, "model.safetensors")
    mtime = os.path.getmtime(weights)
    assert default_tiny_model_dir() == model_dir and os.path.getmtime(weights) == mtime
    make_model(model_dir)


def test_loading_reports_progress_over_the_tensors(tiny_qwen3_dir: str, capsys) -> None:
    model = make_model(tiny_qwen3_dir, load_format="dummy")
    load_model(model, tiny_qwen3_dir)  # progress=None: no terminal here, so quiet
    assert "Loading weights" not in capsys.readouterr().err
    load_model(model, tiny_qwen3_dir, progress=True)
    num_tensors = len(load_file(os.path.join(tiny_qwen3_dir, "model.safetensors")))
    assert "Loading weights: 100%|" in (err := capsys.readouterr().err)
    assert f"{num_tensors}/{num_tensors}" in err
