"""Our reading of the GGUF file against transformers' own GGUF reader (independent name map,
q/k un-permutation and config parsing): the converted checkpoint must match it exactly."""

from __future__ import annotations

import dataclasses

import torch
from safetensors.torch import load_file

from minivllm.models.model_config import ModelConfig

CONFIG_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rope_theta",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
)


def test_converted_weights_and_config_match_transformers(demo_gguf, converted_dir, hf_model):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # hf_model only lends transformers its parameter names for the GGUF -> HF name map.
    theirs = load_gguf_checkpoint(demo_gguf, return_tensors=True, model_to_load=hf_model)
    ours = load_file(f"{converted_dir}/model.safetensors")
    assert sorted(ours) == sorted(theirs["tensors"])
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs["tensors"][name].float()), name
    config = dataclasses.asdict(ModelConfig.from_hf(demo_gguf))
    hf = theirs["config"]
    for key in CONFIG_KEYS:
        assert config[key] == hf[key], key
    assert config["eos_token_ids"] == (hf["eos_token_id"],)
    assert config["rope_scaling"] is None and config["architecture"] == "LlamaForCausalLM"
