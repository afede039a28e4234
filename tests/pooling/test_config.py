"""The pooling a model directory declares (sentence-transformers' files, config.json), and
PoolingParams' checks."""

from __future__ import annotations

import json
import os

import pytest

from minivllm.pooling.config import load_pooling_config
from minivllm.pooling.params import PoolingParams


def _model_dir(tmp_path, pooling: dict | None = None, normalize: bool = False, **config) -> str:
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"hidden_size": 64, **config}, f)
    if pooling is not None:
        modules = [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}]
        modules.append(
            {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
        )
        if normalize:
            modules.append(
                {"idx": 2, "path": "2", "type": "sentence_transformers.models.Normalize"}
            )
        with open(tmp_path / "modules.json", "w") as f:
            json.dump(modules, f)
        os.makedirs(tmp_path / "1_Pooling")
        with open(tmp_path / "1_Pooling" / "config.json", "w") as f:
            json.dump(pooling, f)
    return str(tmp_path)


def test_defaults_without_sentence_transformers_files(tmp_path) -> None:
    config = load_pooling_config(_model_dir(tmp_path))
    assert (config.pooling_type, config.normalize, config.hidden_size) == ("last", True, 64)
    assert config.embed_params(16).dimensions == 16


@pytest.mark.parametrize(
    "pooling, want",
    [
        ({"pooling_mode": "lasttoken"}, "last"),
        ({"pooling_mode": "cls"}, "cls"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "mean"),
        ({}, "mean"),  # sentence-transformers' default
    ],
)
def test_pooling_modes(tmp_path, pooling, want) -> None:
    config = load_pooling_config(_model_dir(tmp_path, pooling, normalize=True))
    assert (config.pooling_type, config.normalize) == (want, True)
    # Without a Normalize module, not normalised.
    assert not load_pooling_config(_model_dir(_fresh(tmp_path), pooling)).normalize


def _fresh(tmp_path):
    path = tmp_path / "plain"
    path.mkdir()
    return path


@pytest.mark.parametrize(
    "pooling, match",
    [
        ({"pooling_mode": "max"}, "pooling mode 'max' is not supported"),
        ({"pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": True}, "not supported"),
        ({"pooling_mode": "lasttoken", "include_prompt": False}, "include_prompt"),
    ],
)
def test_unsupported_pooling_names_the_file(tmp_path, pooling, match) -> None:
    with pytest.raises(ValueError, match=match) as e:
        load_pooling_config(_model_dir(tmp_path, pooling))
    assert "1_Pooling/config.json" in str(e.value)


def test_matryoshka_dimensions(tmp_path) -> None:
    config = load_pooling_config(_model_dir(tmp_path, matryoshka_dimensions=[16, 32, 64]))
    assert config.embed_params(32).dimensions == 32
    with pytest.raises(ValueError, match=r"dimensions must be one of \[16, 32, 64\]"):
        config.embed_params(20)
    with pytest.raises(ValueError, match="at most 64"):
        load_pooling_config(_model_dir(_fresh(tmp_path))).embed_params(65)
    with pytest.raises(ValueError, match="does not support Matryoshka"):
        load_pooling_config(_model_dir(tmp_path, is_matryoshka=False)).embed_params(16)
    with pytest.raises(ValueError, match="positive integer"):
        config.embed_params(0)


def test_pooling_params_checks() -> None:
    with pytest.raises(ValueError, match="task"):
        PoolingParams(task="classify")
    with pytest.raises(ValueError, match="pooling_type"):
        PoolingParams(pooling_type="max")
    with pytest.raises(ValueError, match="score_token_ids"):
        PoolingParams(task="score")
    with pytest.raises(ValueError, match="last prompt position"):
        PoolingParams("score", "mean", False, None, (0, 1))
    assert PoolingParams(pooling_type="cls").needs_all_rows
    assert not PoolingParams().needs_all_rows
