"""Builds a model on its device and fills its weights: safetensors checkpoints or dummy.

Checkpoint names are mapped onto packed parameters with the model's packed_modules_mapping;
every parameter's own weight_loader copies this rank's slice of the full tensor. With a
QuantConfig the linear layers hold block-FP8 weights (layers/quantization/).
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Iterator

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from tqdm.auto import tqdm

from minivllm.attention.base import AttentionBackend
from minivllm.gguf_loader import find_gguf_file, iterate_gguf_tensors
from minivllm.layers.dispatch import use_triton_kernels
from minivllm.layers.linear import default_weight_loader
from minivllm.layers.norm import RMSNorm
from minivllm.layers.ops import DEFAULT_OPS, LayerOps
from minivllm.layers.quantization.build import check_ignored_layers, quantized_ops
from minivllm.layers.quantization.config import QuantConfig
from minivllm.model_loader_experts import expected_expert_loads, expert_target
from minivllm.models.model_config import ModelConfig
from minivllm.models.registry import get_model_class

logger = logging.getLogger(__name__)


def build_model(
    model_config: ModelConfig,
    attn_backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str,
    model_dir: str | None = None,
    load_format: str = "auto",
    seed: int = 0,
    ops: LayerOps = DEFAULT_OPS,
    quant: QuantConfig | None = None,
    progress: bool | None = None,
) -> nn.Module:
    """Constructs the registered class on `device` in `dtype` with the layers' `ops` (their
    linear layers in block FP8 under `quant`), then loads its weights ("auto": safetensors or
    GGUF from model_dir; "dummy": random, seeded). progress: a bar over the checkpoint's
    tensors (None: on a terminal)."""
    model_class = get_model_class(model_config.architecture)
    ops = quantized_ops(ops, quant)
    with torch.device(device):
        use_triton = use_triton_kernels(device)
        model = model_class(model_config, attn_backend, dtype=dtype, use_triton=use_triton, ops=ops)
    if quant is not None:
        check_ignored_layers(model, quant, getattr(model, "packed_modules_mapping", {}))
    if load_format == "dummy":
        load_dummy_weights(model, seed)
    elif load_format == "auto":
        if model_dir is None:
            raise ValueError("load_format='auto' needs model_dir")
        load_model(model, model_dir, progress)
    else:
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    return model.eval()


def safetensors_files(model_dir: str) -> list[str]:
    """The checkpoint files: those of model.safetensors.index.json if present, else all."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(model_dir, name) for name in weight_map.values()})
    else:
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors files in model directory {model_dir!r}")
    return files


def iterate_checkpoint(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) over every checkpoint file; a corrupt file is a ValueError."""
    for path in safetensors_files(model_dir):
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(
                f"cannot read checkpoint file {path!r} (corrupt or truncated?): {e}"
            ) from e


def count_checkpoint_tensors(model_dir: str) -> int:
    """How many tensors the safetensors files hold (their headers only)."""
    total = 0
    for path in safetensors_files(model_dir):
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                total += len(f.keys())
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ValueError(f"cannot read checkpoint file {path!r} (corrupt?): {e}") from e
    return total


def _checkpoint_tensors(
    model_dir: str, progress: bool | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """A .gguf file (or a directory holding one) is dequantized; else safetensors. progress: a
    tqdm bar over the tensors on stderr (None: only on a terminal, so quiet in tests and logs)."""
    gguf_file = find_gguf_file(model_dir)
    if gguf_file is not None:
        tensors, total = iterate_gguf_tensors(gguf_file), None
    else:
        tensors, total = iterate_checkpoint(model_dir), count_checkpoint_tensors(model_dir)
    disable = None if progress is None else not progress
    return iter(
        tqdm(tensors, total=total, desc="Loading weights", unit=" tensors", disable=disable)
    )


def _skip(name: str, tie_word_embeddings: bool) -> bool:
    # Old checkpoints store RoPE inverse frequencies; we compute our own.
    return name.endswith("rotary_emb.inv_freq") or (
        tie_word_embeddings and name == "lm_head.weight"
    )


def _model_tensors(
    model: nn.Module, model_dir: str, progress: bool | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors under the model's own names: prefixes mapped by its
    checkpoint_prefix_map; those under its ignored_checkpoint_prefixes (parts it does not run,
    such as a vision tower) left out, and counted in a log line; a tensor that the model stores
    as several (its split_checkpoint_tensor, where it has one) split."""
    prefix_map: dict[str, str] = getattr(model, "checkpoint_prefix_map", {})
    split = getattr(model, "split_checkpoint_tensor", None)
    ignored_prefixes = tuple(getattr(model, "ignored_checkpoint_prefixes", ()))
    num_ignored = 0
    for name, tensor in _checkpoint_tensors(model_dir, progress):
        if ignored_prefixes and name.startswith(ignored_prefixes):
            num_ignored += 1
            continue
        for ckpt_prefix, prefix in prefix_map.items():
            if name.startswith(ckpt_prefix):
                name = prefix + name[len(ckpt_prefix) :]
                break
        if split is None:
            yield name, tensor
        else:
            yield from split(name, tensor)
    if num_ignored:
        logger.info(
            "not loaded: %d checkpoint tensors under %s (parts this engine does not run)",
            num_ignored, ", ".join(ignored_prefixes),
        )  # fmt: skip


def _packed_target(name: str, mapping: dict[str, tuple[str, object]]) -> tuple[str, object]:
    """Checkpoint name -> (parameter name, shard_id); shard_id None for unpacked ones."""
    for ckpt_part, (packed_part, shard_id) in mapping.items():
        if f".{ckpt_part}." in name:
            return name.replace(f".{ckpt_part}.", f".{packed_part}."), shard_id
    return name, None


def _expected_loads(
    model: nn.Module, mapping: dict[str, tuple[str, object]], expert_mapping: dict
) -> dict:
    """(parameter name, shard_id) -> checkpoint name, for every load the model needs."""
    expected = expected_expert_loads(dict(model.named_parameters()), expert_mapping)
    stacked = {param_name for param_name, _ in expected}
    for param_name, param in model.named_parameters():
        # Quantizing at load: an FP8 scale comes with its weight, not from the checkpoint.
        if param_name in stacked or getattr(param, "filled_by_weight", False):
            continue
        shards = [(c, s) for c, (p, s) in mapping.items() if f".{p}." in param_name]
        if not shards:
            expected[(param_name, None)] = param_name
        for ckpt_part, shard_id in shards:
            packed_part = mapping[ckpt_part][0]
            ckpt_name = param_name.replace(f".{packed_part}.", f".{ckpt_part}.")
            expected[(param_name, shard_id)] = ckpt_name
    return expected


def load_model(model: nn.Module, model_dir: str, progress: bool | None = None) -> None:
    """Loads every parameter from the safetensors in model_dir (tensors cast to the
    parameter's dtype); raises ValueError listing all unloaded parameters. progress: see
    _checkpoint_tensors."""
    mapping = getattr(model, "packed_modules_mapping", {})
    expert_mapping = getattr(model, "expert_modules_mapping", {})
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    params = dict(model.named_parameters())
    expected = _expected_loads(model, mapping, expert_mapping)
    loaded, unexpected = set(), []
    bare = False  # a checkpoint of the bare decoder (no "model." prefix, no LM head)
    has_decoder = "model.embed_tokens.weight" in params
    for ckpt_name, tensor in _model_tensors(model, model_dir, progress):
        if _skip(ckpt_name, tied):
            continue
        if not ckpt_name.startswith(("model.", "lm_head.")) and has_decoder:
            ckpt_name, bare = f"model.{ckpt_name}", True
        target = expert_target(ckpt_name, expert_mapping)
        param_name, shard_id = target or _packed_target(ckpt_name, mapping)
        if param_name not in params:
            unexpected.append(ckpt_name)
            continue
        param = params[param_name]
        weight_loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            with torch.no_grad():
                weight_loader(param, tensor, shard_id)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"cannot load {ckpt_name!r} into {param_name!r}: {e}") from e
        loaded.add((param_name, shard_id))
    if unexpected:
        raise ValueError(f"checkpoint tensors with no model parameter: {sorted(unexpected)}")
    if bare:
        _head_from_embeddings(params, loaded)
    missing = sorted(ckpt for key, ckpt in expected.items() if key not in loaded)
    if missing:
        raise ValueError(
            f"{len(missing)} weight(s) missing from the checkpoint in {model_dir!r}: {missing}"
        )


@torch.no_grad()
def _head_from_embeddings(params: dict[str, nn.Parameter], loaded: set) -> None:
    """An untied LM head that a bare-decoder checkpoint lacks: the embeddings. Embedding
    models (Qwen3-Embedding, as sentence-transformers saves them) are the bare decoder; their
    head only scores the one throwaway token a pooling request samples."""
    if ("lm_head.weight", None) not in loaded and "lm_head.weight" in params:
        params["lm_head.weight"].copy_(params["model.embed_tokens.weight"])
        loaded.add(("lm_head.weight", None))


@torch.no_grad()
def load_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights of the right shapes: normal(0, 0.02), norm weights 1; deterministic
    for a given seed and device."""
    generators: dict[torch.device, torch.Generator] = {}
    seen: set[int] = set()  # a tied weight belongs to two modules; fill it once
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, RMSNorm):
                param.fill_(1.0)
                continue
            if hasattr(param, "dummy_value"):  # an FP8 weight's block scales
                param.fill_(param.dummy_value)
                continue
            if param.device not in generators:
                generators[param.device] = torch.Generator(param.device).manual_seed(seed)
            # Sampled in float32: normal_ on low-precision dtypes is not supported everywhere.
            values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
            std = getattr(param, "dummy_std", 0.02)
            param.copy_(values.normal_(0.0, std, generator=generators[param.device]))
