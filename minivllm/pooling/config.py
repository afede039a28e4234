"""The pooling a model's files declare: sentence-transformers' modules.json and its Pooling
module's config.json (pooling mode, whether a Normalize module follows), config.json's
Matryoshka dimensions. A decoder without them pools its last token, normalised (as
Qwen3-Embedding and vLLM's default for a causal LM)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from minivllm.pooling.params import PoolingParams, PoolingType

# sentence-transformers' pooling modes (new "pooling_mode" values and legacy bool keys).
_MODES = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class PoolingConfig:
    """hidden_size: the full embedding's length. matryoshka_dimensions: the lengths the model
    was trained to be cut to (None: any length up to hidden_size is accepted, as vLLM does
    for a model that says nothing; an empty tuple: none, dimensions is refused)."""

    pooling_type: PoolingType
    normalize: bool
    hidden_size: int
    matryoshka_dimensions: tuple[int, ...] | None = None

    def embed_params(self, dimensions: int | None = None) -> PoolingParams:
        """The PoolingParams of an embedding request; ValueError naming dimensions if the
        model cannot give that many."""
        if dimensions is not None:
            _check_dimensions(dimensions, self.hidden_size, self.matryoshka_dimensions)
        return PoolingParams("embed", self.pooling_type, self.normalize, dimensions)


def load_pooling_config(model_dir: str) -> PoolingConfig:
    """The model directory's pooling (ValueError naming the file for a mode we cannot run)."""
    hf_config = _read_json(os.path.join(model_dir, "config.json")) or {}
    hidden_size = hf_config.get("hidden_size")
    if not isinstance(hidden_size, int):
        raise ValueError(f"{model_dir}/config.json has no integer hidden_size")
    pooling_type, normalize = "last", True
    modules = _read_json(os.path.join(model_dir, "modules.json"))
    if modules is not None:
        pooling_type, normalize = _read_modules(model_dir, modules)
    matryoshka = None
    if hf_config.get("is_matryoshka") is False:
        matryoshka = ()
    elif isinstance(hf_config.get("matryoshka_dimensions"), list):
        matryoshka = tuple(int(d) for d in hf_config["matryoshka_dimensions"])
    return PoolingConfig(pooling_type, normalize, hidden_size, matryoshka)


def _read_modules(model_dir: str, modules: object) -> tuple[PoolingType, bool]:
    """(pooling type, normalize) from sentence-transformers' module list."""
    if not isinstance(modules, list):
        raise ValueError(f"{model_dir}/modules.json is not a list of modules")
    pooling_type: PoolingType = "last"
    normalize = False
    for module in modules:
        kind = str(module.get("type", "")) if isinstance(module, dict) else ""
        if kind.endswith(".Normalize"):
            normalize = True
        elif kind.endswith(".Pooling"):
            path = os.path.join(model_dir, module.get("path", ""), "config.json")
            pooling_type = _read_pooling_mode(path)
    return pooling_type, normalize


def _read_pooling_mode(path: str) -> PoolingType:
    config = _read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the Pooling module's config is missing or not an object")
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [m for key, m in _LEGACY_KEYS.items() if config.get(key)]
        mode = modes[0] if len(modes) == 1 else (modes or "mean")
    if config.get("include_prompt", True) is not True:
        raise ValueError(f"{path}: include_prompt false is not supported")
    if not isinstance(mode, str) or mode not in _MODES:
        raise ValueError(
            f"{path}: pooling mode {mode!r} is not supported (supported: {sorted(_MODES)})"
        )
    return _MODES[mode]  # type: ignore[return-value]


def _check_dimensions(
    dimensions: int, hidden_size: int, matryoshka: tuple[int, ...] | None
) -> None:
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
    if matryoshka == ():
        raise ValueError("dimensions: this model does not support Matryoshka truncation")
    if matryoshka is not None and dimensions not in matryoshka:
        raise ValueError(f"dimensions must be one of {list(matryoshka)}, got {dimensions}")
    if dimensions > hidden_size:
        raise ValueError(f"dimensions must be at most {hidden_size}, got {dimensions}")


def _read_json(path: str) -> object | None:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
