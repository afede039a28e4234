"""GGUF files built from the tiny random dense checkpoints (tests/gguf_files.py: names from the
gguf package's own HF -> GGUF map, Llama's q/k rows permuted as llama.cpp's converter does) load
into the same model as the safetensors; unsupported architectures, tensor types and RoPE scaling
are clear errors."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF support needs the gguf package")

from minivllm.attention.torch_sdpa import TorchSDPABackend  # noqa: E402
from minivllm.gguf_loader import LLAMA3_ROPE, find_gguf_file, open_gguf  # noqa: E402
from minivllm.model_loader import build_model  # noqa: E402
from minivllm.models.model_config import ModelConfig  # noqa: E402
from minivllm.tiny_model import build_tiny_model  # noqa: E402
from tests.gguf_files import write_gguf, write_header  # noqa: E402
from tests.helpers import prefill_logits  # noqa: E402

DENSE_ARCHS = ["Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"]


def rope_scaling(config: ModelConfig) -> dict | None:
    """transformers 5 keeps rope_theta inside the scaling dict too; it is not part of it."""
    if config.rope_scaling is None:
        return None
    return {k: v for k, v in config.rope_scaling.items() if k != "rope_theta"}


@pytest.fixture(scope="module", params=DENSE_ARCHS)
def tiny_pair(request, tmp_path_factory) -> tuple[str, str]:
    """(HF directory, GGUF file) of one tiny random checkpoint; Llama with Llama 3.1's RoPE
    scaling, whose three frequency bands head_dim 16 and theta 1e4 all reach."""
    out = tmp_path_factory.mktemp("tiny-gguf")
    overrides = {}
    if request.param == "LlamaForCausalLM":
        rope = dict(LLAMA3_ROPE, factor=8.0)
        overrides = dict(rope_scaling=rope, max_position_embeddings=16384)
    hf_dir = build_tiny_model(str(out / "hf"), request.param, **overrides)
    return hf_dir, write_gguf(hf_dir, str(out / "model.gguf"))


def test_gguf_loads_the_same_model_as_safetensors(tiny_pair) -> None:
    hf_dir, gguf_file = tiny_pair
    ours, want = ModelConfig.from_hf(gguf_file), ModelConfig.from_hf(hf_dir)
    assert ours.rms_norm_eps == pytest.approx(want.rms_norm_eps, rel=1e-6)  # stored as float32
    assert replace(ours, rms_norm_eps=want.rms_norm_eps) == replace(
        want, bos_token_id=None, rope_scaling=rope_scaling(want)
    )
    prompts = [[5, 17, 42, 99, 3], list(range(20, 57))]
    logits = []
    for path in (hf_dir, gguf_file):
        config = ModelConfig.from_hf(path)
        model = build_model(config, TorchSDPABackend(), torch.float32, "cpu", path)
        logits.append(torch.cat(prefill_logits(model, prompts)))
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)


def test_directory_with_one_gguf(tiny_pair, tmp_path) -> None:
    _, gguf_file = tiny_pair
    os.symlink(gguf_file, tmp_path / "a.gguf")
    assert find_gguf_file(str(tmp_path)) == str(tmp_path / "a.gguf")
    os.symlink(gguf_file, tmp_path / "b.gguf")
    with pytest.raises(ValueError, match="several .gguf files"):
        ModelConfig.from_hf(str(tmp_path))


def minimal_gguf(path: str, arch: str, tensors: dict) -> str:
    writer = gguf.GGUFWriter(path, arch)
    write_header(
        writer,
        dict(
            num_hidden_layers=1,
            max_position_embeddings=64,
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=64,
            rms_norm_eps=1e-6,
            vocab_size=32,
            eos_token_id=0,
        ),
    )
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_architecture_is_a_clear_error(tmp_path) -> None:
    norm = (np.ones(256, dtype=np.float32), None)
    path = minimal_gguf(str(tmp_path / "m.gguf"), "gpt2", {"output_norm.weight": norm})
    supported = "'llama', 'qwen2', 'qwen3', 'qwen35', 'qwen35moe', 'qwen3moe', 'qwen3next'"
    with pytest.raises(ValueError, match=rf"'gpt2'.*supported: \[{supported}\]"):
        ModelConfig.from_hf(path)


def test_type_gguf_cannot_dequantize_is_a_clear_error(tmp_path) -> None:
    # Q8_K (llama.cpp's internal dot-product type): 292 bytes per block of 256 values.
    q8_k = (np.zeros((256, 292), dtype=np.uint8), gguf.GGMLQuantizationType.Q8_K)
    path = minimal_gguf(str(tmp_path / "m.gguf"), "llama", {"blk.0.attn_q.weight": q8_k})
    with pytest.raises(ValueError, match=r"\['Q8_K'\] cannot be dequantized.*'Q4_1'"):
        ModelConfig.from_hf(path)


def test_rope_scaling_other_than_llama3_is_a_clear_error(tmp_path) -> None:
    freqs = (np.linspace(1.0, 4.0, 32, dtype=np.float32), None)
    path = minimal_gguf(str(tmp_path / "m.gguf"), "llama", {"rope_freqs.weight": freqs})
    with pytest.raises(ValueError, match="not Llama 3's RoPE scaling"):
        ModelConfig.from_hf(path)


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tiny_pair) -> None:
    hf_dir, gguf_file = tiny_pair
    want = rope_scaling(ModelConfig.from_hf(hf_dir))
    assert ModelConfig.from_hf(gguf_file).rope_scaling == want
    assert (want is None) == ("Llama" not in ModelConfig.from_hf(hf_dir).architecture)


def test_missing_metadata_is_a_clear_error(tmp_path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_block_count(1)  # and nothing else
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="no 'llama.attention.head_count' metadata"):
        ModelConfig.from_hf(str(tmp_path / "m.gguf"))


def test_a_file_rewritten_in_place_is_read_again(tmp_path) -> None:
    """The last file's reader is kept (config and weights parse it once); a new file at the
    same path is another key (its size and modification time), so its own contents are read."""
    path = str(tmp_path / "m.gguf")
    freqs = (np.linspace(1.0, 4.0, 32, dtype=np.float32), None)
    minimal_gguf(path, "llama", {"rope_freqs.weight": freqs})
    assert open_gguf(path) is open_gguf(path)
    with pytest.raises(ValueError, match="not Llama 3's RoPE scaling"):
        ModelConfig.from_hf(path)
    minimal_gguf(path, "gpt2", {"output_norm.weight": (np.ones(256, dtype=np.float32), None)})
    with pytest.raises(ValueError, match=r"'gpt2'.*supported"):
        ModelConfig.from_hf(path)
