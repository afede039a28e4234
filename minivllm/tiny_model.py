"""Model directories built locally, so that nothing is ever downloaded: a tiny random-weight HF
checkpoint with a tiny byte-level BPE tokenizer (tests, the CLI; deterministic for a given
seed), and weightless directories of the shipped real configs (load_format="dummy" runs).
"""

from __future__ import annotations

import json
import os
import shutil
from importlib import resources
from typing import Any

import torch

from minivllm.cache_dir import cache_root, publish_dir
from minivllm.layers.quantization.config import BLOCK as FP8_BLOCK

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. Once upon a time there was a small model that
wanted to learn to speak. It read every book in the library, from the first page to the last.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris is
the capital of France. One, two, three, four, five, six, seven, eight, nine, ten.
The sun rises in the east and sets in the west. Water is made of hydrogen and oxygen.
def main():\n    print("hello")\n    return 0\n
A paged attention cache stores keys and values in blocks. The scheduler decides which requests
run in each step, and the model computes the next token for every running sequence.
Numbers like 0 1 2 3 4 5 6 7 8 9 and 2024 or 3.14 appear in text too, as do symbols: @#$%&*.
"""
SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # Larger than HF's 0.02 so that logits are peaked and greedy choices are not near-ties.
    initializer_range=0.1,
)
# The hybrid families' layers (Qwen3.5, Qwen3.5-MoE, Qwen3-Next), and their experts.
_TINY_HYBRID: dict[str, Any] = dict(
    head_dim=32,
    num_hidden_layers=4,
    tie_word_embeddings=False,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
)
_TINY_EXPERTS: dict[str, Any] = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)
ARCH_OVERRIDES: dict[str, dict[str, Any]] = {
    "Qwen3ForCausalLM": dict(head_dim=32, tie_word_embeddings=True, rope_theta=1000000.0),
    "Qwen2ForCausalLM": dict(tie_word_embeddings=False, rope_theta=1000000.0),
    # Sparse layers 0 and 2, a dense MLP in layer 1 (mlp_only_layers).
    "Qwen3MoeForCausalLM": dict(
        head_dim=32,
        num_hidden_layers=3,
        tie_word_embeddings=False,
        rope_theta=1000000.0,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    ),
    # Hybrid: layers 0-2 Gated DeltaNet, layer 3 full attention (RoPE over 8 of 32 dims).
    "Qwen3_5ForCausalLM": _TINY_HYBRID,
    # Every MLP 8 experts (top-2) and a shared expert; no dense MLP, so no intermediate_size
    # (None: left out of config.json, as the real one has none).
    "Qwen3_5MoeForCausalLM": dict(**_TINY_HYBRID, **_TINY_EXPERTS, intermediate_size=None),
    # Qwen3.5-MoE's layers (its GDN in-projections fused per key head), a dense MLP in layer 1.
    "Qwen3NextForCausalLM": dict(
        **_TINY_HYBRID, **_TINY_EXPERTS, norm_topk_prob=True, mlp_only_layers=[1]
    ),
    "LlamaForCausalLM": dict(
        head_dim=16,
        tie_word_embeddings=True,
        # original 64 against max 512 puts head_dim 16's frequencies in all three bands.
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
        rope_theta=10000.0,
    ),
}


def build_tiny_tokenizer(vocab_size: int = 500):
    """A byte-level BPE trained on TRAINING_TEXT, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is in the vocab, so any string encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXT.splitlines(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHAT_TEMPLATE,
    )


def tiny_hf_config(architecture: str, vocab_size: int, eos_token_id: int, **overrides: Any):
    """The transformers config of a tiny model of `architecture`."""
    from transformers import (
        LlamaConfig,
        Qwen2Config,
        Qwen3_5MoeTextConfig,
        Qwen3_5TextConfig,
        Qwen3Config,
        Qwen3MoeConfig,
        Qwen3NextConfig,
    )

    config_classes = {
        "Qwen3ForCausalLM": Qwen3Config,
        "Qwen3_5ForCausalLM": Qwen3_5TextConfig,
        "Qwen3_5MoeForCausalLM": Qwen3_5MoeTextConfig,
        "Qwen3MoeForCausalLM": Qwen3MoeConfig,
        "Qwen3NextForCausalLM": Qwen3NextConfig,
        "Qwen2ForCausalLM": Qwen2Config,
        "LlamaForCausalLM": LlamaConfig,
    }
    if architecture not in config_classes:
        raise ValueError(
            f"unknown tiny architecture {architecture!r}; supported: {sorted(config_classes)}"
        )
    options = {
        **SIZES,
        **ARCH_OVERRIDES[architecture],
        "vocab_size": vocab_size,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": eos_token_id,
        **overrides,
    }
    options = {key: value for key, value in options.items() if value is not None}
    config = config_classes[architecture](**options)
    config.architectures = [architecture]
    config.dtype = "float32"
    return config


def build_tiny_model(
    out_dir: str, architecture: str = "Qwen3ForCausalLM", seed: int = 0, **overrides: Any
) -> str:
    """Writes config.json, model.safetensors, generation_config.json and the tokenizer files
    into out_dir; `overrides` replace config fields (e.g. tie_word_embeddings=False)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tiny_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    im_end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = tiny_hf_config(architecture, len(tokenizer), eos_id, **overrides)
    # fork_rng keeps the caller's global RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=[im_end_id, eos_id], pad_token_id=eos_id
    )
    generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def make_parity_model_dir(name: str, out_dir: str, seed: int = 0) -> str:
    """make_dummy_model_dir plus random bf16 weights (torch seed `seed`) with the embeddings
    (tied: also the LM head) scaled by 8: the GPU tests' parity model. Default init makes
    next-token logits nearly flat (std ~0.6 over 151,936 tokens): the top two differ by less
    than bf16 rounding, so any two bf16 implementations disagree on ties; sharper logits make
    agreement measure correctness rather than tie-breaking."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    make_dummy_model_dir(name, out_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(out_dir), dtype=torch.bfloat16
    )
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    model.save_pretrained(out_dir)
    return out_dir


def parity_prompts(num: int, length: int, seed: int = 0) -> list[list[int]]:
    """num seeded prompts of random token ids in [2, 150000], lengths length, length - 7, ...:
    the parity model's teacher-forced inputs (GPU tests, kv_format_accuracy.py)."""
    import random

    rng = random.Random(seed)
    return [[rng.randint(2, 150000) for _ in range(length - 7 * i)] for i in range(num)]


def default_tiny_model_dir() -> str:
    """tiny-qwen3 in minivllm's cache (~/.cache/minivllm unless set), built on first use."""
    out_dir = os.path.join(cache_root(), "tiny-qwen3")
    if not os.path.isdir(out_dir):
        publish_dir(out_dir, build_tiny_model)  # a concurrent reader never sees half a model
    return out_dir


# config.json's quantization_config of Qwen's official -FP8 checkpoints (block-wise W8A8).
FP8_BLOCK_QUANTIZATION = {
    "quant_method": "fp8",
    "weight_block_size": list(FP8_BLOCK),
    "activation_scheme": "dynamic",
}


def make_dummy_model_dir(name: str, out_dir: str, quantization: str | None = None) -> str:
    """Writes config.json (minivllm/configs/<name>.json: real hyperparameters, no weights) and
    a full-vocabulary word-level tokenizer into out_dir, for load_format="dummy" runs.
    quantization "fp8": the config says what Qwen's -FP8 checkpoints say (block-wise FP8
    weights), so that both engines load the dummy weights in that layout."""
    if quantization not in (None, "fp8"):
        raise ValueError(f"quantization must be None or 'fp8', got {quantization!r}")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out_dir, exist_ok=True)
    src = resources.files("minivllm") / "configs" / f"{name}.json"
    with resources.as_file(src) as path:
        shutil.copy(path, os.path.join(out_dir, "config.json"))
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    if quantization == "fp8":
        cfg["quantization_config"] = _fp8_quantization_config(cfg)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
    cfg = cfg.get("text_config", cfg)  # a vision-language config's language model
    if not os.path.exists(os.path.join(out_dir, "tokenizer.json")):
        vocab = {f"t{i}": i for i in range(cfg["vocab_size"])}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        eos = f"t{cfg['eos_token_id']}"
        PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos).save_pretrained(
            out_dir
        )
    return out_dir


def _fp8_quantization_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen's FP8 quantization_config for cfg: block FP8, and for a hybrid model the projections
    its FP8 checkpoints keep in bf16 by full name (each Gated DeltaNet layer's b and a: 48
    outputs, no whole 128-block), as vLLM needs them named (it matches names exactly)."""
    text = cfg.get("text_config", cfg)
    prefix = "model.language_model.layers" if "text_config" in cfg else "model.layers"
    keep = [
        f"{prefix}.{i}.linear_attn.{proj}"
        for i, kind in enumerate(text.get("layer_types") or [])
        if kind == "linear_attention"
        for proj in ("in_proj_b", "in_proj_a")
    ]
    return {**FP8_BLOCK_QUANTIZATION, **({"modules_to_not_convert": keep} if keep else {})}


def write_sentence_transformers_files(model_dir: str, mode: str, normalize: bool) -> None:
    """sentence-transformers' files of an embedding model into model_dir: modules.json (the
    Transformer, a Pooling module of `mode`, "last", "mean" or "cls", and a Normalize module
    where normalize) and the Pooling module's config (legacy keys, which every version reads)."""
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")]
    if normalize:
        kinds.append(("2_Normalize", "Normalize"))
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(kinds)
    ]
    for path, _ in kinds[1:]:
        os.makedirs(os.path.join(model_dir, path), exist_ok=True)
    with open(os.path.join(model_dir, "modules.json"), "w") as f:
        json.dump(modules, f)
    with open(os.path.join(model_dir, "config.json")) as f:
        hidden_size = json.load(f)["hidden_size"]
    pooling = {"word_embedding_dimension": hidden_size, "include_prompt": True}
    for key, name in (
        ("pooling_mode_lasttoken", "last"),
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_cls_token", "cls"),
    ):
        pooling[key] = mode == name
    with open(os.path.join(model_dir, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f)
    with open(os.path.join(model_dir, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 512, "do_lower_case": False}, f)
