"""Qwen3-MoE GGUF files (llama.cpp's `qwen3moe`: experts stacked as `blk.N.ffn_{gate,up,down}_exps`,
the router `ffn_gate_inp`) written from a tiny random checkpoint in F32, F16 and Q8_0, with its
tokenizer: the engine on the bare file tokenizes as the checkpoint does, and its greedy tokens and
logprobs equal HF's float32 model on the values the file holds, batched and alone; routing that
the engine does not run is a clear error."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest

gguf = pytest.importorskip("gguf", reason="GGUF support needs the gguf package")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from minivllm.models.model_config import ModelConfig  # noqa: E402
from minivllm.tiny_model import build_tiny_model  # noqa: E402
from tests.gguf_files import stored_values, write_gguf, write_header  # noqa: E402
from tests.models.hf_greedy import assert_batched_and_alone_match_hf, cpu_llm  # noqa: E402

PROMPTS = [[5, 17, 42, 99, 3], list(range(20, 57)), [11], [7] * 13 + [8, 9]]
MAX_TOKENS = 8
# GGML type -> the checkpoint dtype the file states (a quantized one says bfloat16).
QTYPES = {"F32": "float32", "F16": "float16", "Q8_0": "bfloat16"}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    """Every layer sparse, as llama.cpp's qwen3moe has it (the tiny default keeps one dense)."""
    out = tmp_path_factory.mktemp("tiny-moe")
    return build_tiny_model(str(out / "hf"), "Qwen3MoeForCausalLM", mlp_only_layers=[])


@pytest.fixture(scope="module", params=list(QTYPES))
def gguf_and_reference(request, hf_dir, tmp_path_factory) -> tuple[str, str, str]:
    """(GGUF file of a GGML type, HF directory of the values it holds: each tensor quantized
    and dequantized by the `gguf` package under its HF name, the type)."""
    qtype = gguf.GGMLQuantizationType[request.param]
    out = tmp_path_factory.mktemp(f"gguf-{request.param}")
    gguf_file = write_gguf(hf_dir, str(out / "model.gguf"), qtype)
    ref_dir = str(out / "ref")
    shutil.copytree(hf_dir, ref_dir)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    rounded = {name: stored_values(t, qtype) for name, t in tensors.items()}
    save_file(rounded, os.path.join(ref_dir, "model.safetensors"), metadata={"format": "pt"})
    return gguf_file, ref_dir, request.param


def test_gguf_config_is_the_checkpoints(hf_dir, gguf_and_reference) -> None:
    gguf_file, _, qtype = gguf_and_reference
    ours, want = ModelConfig.from_hf(gguf_file), ModelConfig.from_hf(hf_dir)
    assert ours.moe == want.moe and ours.moe.num_experts == 8
    assert replace(ours, rms_norm_eps=want.rms_norm_eps) == replace(
        want, bos_token_id=None, torch_dtype=QTYPES[qtype]
    )


def test_greedy_tokens_and_logprobs_match_hf(
    hf_dir, gguf_and_reference, tmp_path, monkeypatch
) -> None:
    """The bare file: its tokenizer (from the file's metadata) is the checkpoint's."""
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))  # where it is kept once built
    gguf_file, ref_dir, _ = gguf_and_reference
    llm = cpu_llm(gguf_file)
    text = "<|im_start|>user\nThe quick brown fox, 1 2 3!<|im_end|>"
    assert llm.get_tokenizer().encode(text) == AutoTokenizer.from_pretrained(hf_dir).encode(text)
    hf_model = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    assert_batched_and_alone_match_hf(llm, hf_model, PROMPTS, MAX_TOKENS)


def moe_header(path: str, **metadata) -> str:
    """A qwen3moe file of metadata only; metadata: `{arch}.<key>` values to write."""
    writer = gguf.GGUFWriter(path, "qwen3moe")
    write_header(
        writer,
        dict(
            num_hidden_layers=1, max_position_embeddings=64, hidden_size=64,
            intermediate_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
            rms_norm_eps=1e-6, vocab_size=32, eos_token_id=0, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32,
        ),
    )  # fmt: skip
    for key, (value, kind) in metadata.items():
        writer.add_key_value(f"qwen3moe.{key}", value, kind)
    writer.add_tensor("output_norm.weight", torch.ones(64).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "key,value,kind,message",
    [
        ("expert_gating_func", 2, gguf.GGUFValueType.UINT32, "expert_gating_func is 2"),
        ("expert_weights_scale", 2.5, gguf.GGUFValueType.FLOAT32, "expert_weights_scale 2.5"),
    ],
)
def test_routing_the_engine_does_not_run_is_a_clear_error(tmp_path, key, value, kind, message):
    path = moe_header(str(tmp_path / "m.gguf"), **{key: (value, kind)})
    with pytest.raises(ValueError, match=f"qwen3moe.{message}"):
        ModelConfig.from_hf(path)
    assert ModelConfig.from_hf(moe_header(str(tmp_path / "ok.gguf"))).moe.num_experts == 4
