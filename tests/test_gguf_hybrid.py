"""GGUF files of the hybrid families (llama.cpp's `qwen35`, `qwen35moe`, `qwen3next`) written
from tiny random checkpoints as llama.cpp's converter writes them (tests/gguf_hybrid_files.py:
norms as 1 + w, A_log as -exp(A_log), value heads tiled, Qwen3-Next's in-projection split, an
MTP block appended): the loader gives back the checkpoint's tensors, the config is the
checkpoint's, and the engine on the bare file gives HF's greedy tokens and logprobs on the
values the file holds (F32, F16, Q8_0); missing SSM metadata is a clear error."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest

gguf = pytest.importorskip("gguf", reason="GGUF support needs the gguf package")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from minivllm.gguf_convert import convert_gguf_to_hf  # noqa: E402
from minivllm.gguf_loader import iterate_gguf_tensors  # noqa: E402
from minivllm.layers.gated_delta_weights import split_in_proj  # noqa: E402
from minivllm.models.model_config import ModelConfig  # noqa: E402
from minivllm.tiny_model import build_tiny_model  # noqa: E402
from tests.gguf_files import stored_values, write_gguf, write_header  # noqa: E402
from tests.models.hf_greedy import assert_batched_and_alone_match_hf, cpu_llm  # noqa: E402

# 70 tokens: past one 64-token chunk of the gated delta rule.
PROMPTS = [[5, 17, 42, 99, 3], list(range(20, 90)), [11]]
MAX_TOKENS = 6
# (architecture, GGML type of the matrices, MTP blocks appended); Qwen3-Next's experts' gate and
# up fused in one tensor (the converter's --fuse-gate-up-exps).
CASES = [
    ("Qwen3_5ForCausalLM", "F32", 1),
    ("Qwen3_5ForCausalLM", "Q8_0", 0),
    ("Qwen3_5MoeForCausalLM", "F16", 1),
    ("Qwen3NextForCausalLM", "F32", 0),
]
DTYPES = {"F32": "float32", "F16": "float16", "Q8_0": "bfloat16"}


@pytest.fixture(scope="module", params=CASES, ids=lambda case: f"{case[0]}-{case[1]}")
def case(request, tmp_path_factory) -> tuple[str, str, str, str]:
    """(HF directory, its GGUF file, the HF directory of the values the file holds, GGML type).
    Value heads of 32 dims: Q8_0's blocks of 32 then hold whole heads, so that quantizing
    commutes with llama.cpp's reordering of out_proj's columns by value head. Every layer of
    Qwen3-Next sparse, as llama.cpp's qwen3next has it (the tiny default keeps one dense)."""
    arch, qtype_name, mtp = request.param
    out = tmp_path_factory.mktemp(f"gguf-{arch}-{qtype_name}")
    overrides = {"mlp_only_layers": []} if arch == "Qwen3NextForCausalLM" else {}
    hf_dir = build_tiny_model(str(out / "hf"), arch, linear_value_head_dim=32, **overrides)
    qtype = gguf.GGMLQuantizationType[qtype_name]
    fuse = arch == "Qwen3NextForCausalLM"
    gguf_file = write_gguf(hf_dir, str(out / "model.gguf"), qtype, mtp, fuse_gate_up=fuse)
    ref_dir = str(out / "ref")
    shutil.copytree(hf_dir, ref_dir)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    rounded = {name: stored_values(t, qtype, name) for name, t in tensors.items()}
    save_file(rounded, os.path.join(ref_dir, "model.safetensors"), metadata={"format": "pt"})
    return hf_dir, gguf_file, ref_dir, qtype_name


def test_loaded_tensors_are_the_checkpoints(case) -> None:
    """Every tensor back under HF's name with HF's values (Qwen3-Next's fused in-projection
    as its safetensors path splits it); the MTP block's only under mtp."""
    _, gguf_file, ref_dir, _ = case
    config = ModelConfig.from_hf(ref_dir).linear_attention
    heads = (config.num_k_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim)
    want = {}
    for name, tensor in load_file(os.path.join(ref_dir, "model.safetensors")).items():
        want.update(split_in_proj(name, tensor, *heads) or [(name, tensor)])
    ours = {}
    for name, tensor in iterate_gguf_tensors(gguf_file):
        if name.startswith("mtp."):
            assert name.startswith(f"mtp.blk.{len(config.layer_types)}."), name
            continue
        split = split_in_proj(name, tensor, *heads)
        ours.update(split or [(name, tensor)])
    assert sorted(ours) == sorted(want)
    for name, tensor in want.items():
        torch.testing.assert_close(ours[name], tensor, rtol=1e-6, atol=1e-6, msg=name)


def test_gguf_config_is_the_checkpoints(case) -> None:
    hf_dir, gguf_file, _, qtype = case
    ours, want = ModelConfig.from_hf(gguf_file), ModelConfig.from_hf(hf_dir)
    assert ours.linear_attention == want.linear_attention and ours.moe == want.moe
    assert ours.rms_norm_eps == pytest.approx(want.rms_norm_eps, rel=1e-6)  # stored as float32
    assert replace(ours, rms_norm_eps=want.rms_norm_eps) == replace(
        want, bos_token_id=None, torch_dtype=DTYPES[qtype]
    )


def test_greedy_tokens_and_logprobs_match_hf(case, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))  # where its tokenizer is built
    """The bare file: its tokenizer (from the file's metadata) is the checkpoint's tokenizer.json
    (read by `tokenizers`: transformers' class for Qwen3.5-MoE replaces the tiny tokenizer's
    pre-tokenizer with Qwen3.5's own)."""
    hf_dir, gguf_file, ref_dir, _ = case
    llm = cpu_llm(gguf_file)
    text = "<|im_start|>user\nThe quick brown fox, 1 2 3!<|im_end|>"
    checkpoint = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    assert llm.get_tokenizer().encode(text) == checkpoint.encode(text).ids
    hf_model = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    assert_batched_and_alone_match_hf(llm, hf_model, PROMPTS, MAX_TOKENS)


@torch.no_grad()
def test_converted_directory_is_the_checkpoint_for_transformers(case, tmp_path, monkeypatch):
    """gguf_convert's HF directory (Qwen3-Next's in-projection fused back, no MTP block) gives
    transformers the logits of the values the file holds."""
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    _, gguf_file, ref_dir, _ = case
    converted = convert_gguf_to_hf(gguf_file, str(tmp_path / "hf"))
    tokens = torch.tensor([PROMPTS[1]])
    logits = [
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(tokens).logits
        for path in (converted, ref_dir)
    ]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_missing_ssm_metadata_is_a_clear_error(tmp_path) -> None:
    path = str(tmp_path / "m.gguf")
    writer = gguf.GGUFWriter(path, "qwen35")
    write_header(
        writer,
        dict(
            architectures=[], num_hidden_layers=4, max_position_embeddings=64, hidden_size=64,
            intermediate_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
            rms_norm_eps=1e-6, vocab_size=32, eos_token_id=0,
        ),
    )  # fmt: skip
    writer.add_ssm_conv_kernel(4)
    writer.add_ssm_state_size(16)
    writer.add_ssm_group_count(2)
    writer.add_ssm_time_step_rank(4)  # and no ssm.inner_size
    writer.add_rope_dimension_count(8)
    writer.add_tensor("output_norm.weight", torch.ones(64).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="no 'qwen35.ssm.inner_size' metadata"):
        ModelConfig.from_hf(path)
