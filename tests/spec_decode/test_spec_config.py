"""SpeculativeConfig.from_dict: vLLM's keys and defaults, unknown keys (TypeError), bad values
(ValueError), and the acceptance rule it resolves to."""

from __future__ import annotations

import dataclasses

import pytest

from minivllm.spec_decode.config import (
    DEFAULT_DISABLE_BY_BATCH_SIZE,
    SpeculativeConfig,
    resolve_acceptance,
)


def test_ngram_defaults():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4})
    assert (config.prompt_lookup_max, config.prompt_lookup_min) == (5, 5)
    assert config.model is None and config.acceptance is None
    assert config.disable_by_batch_size == DEFAULT_DISABLE_BY_BATCH_SIZE  # ours; vLLM: None
    never = SpeculativeConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": None}
    )
    assert never.disable_by_batch_size is None
    one = SpeculativeConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    )
    assert (one.prompt_lookup_max, one.prompt_lookup_min) == (3, 3)
    other = SpeculativeConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2}
    )
    assert (other.prompt_lookup_max, other.prompt_lookup_min) == (2, 2)


def test_method_from_model():
    assert SpeculativeConfig.from_dict(
        {"model": "[ngram]", "num_speculative_tokens": 3}
    ) == SpeculativeConfig("ngram", 3, model="ngram")
    draft = SpeculativeConfig.from_dict({"model": "/models/tiny", "num_speculative_tokens": 3})
    assert (draft.method, draft.model) == ("draft_model", "/models/tiny")


def test_frozen():
    config = SpeculativeConfig("ngram", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_speculative_tokens = 4  # type: ignore[misc]


def test_unknown_keys_raise_type_error_naming_them():
    with pytest.raises(TypeError, match=r"\['num_spec_tokens', 'typo'\]"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_spec_tokens": 3, "typo": 1})
    with pytest.raises(TypeError, match="dict"):
        SpeculativeConfig.from_dict([("method", "ngram")])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 3}, "method"),
        ({"method": "eagle", "num_speculative_tokens": 3}, "method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2.5}, "integer"),
        ({"method": "ngram", "num_speculative_tokens": True}, "integer"),
        ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}, ">= 1"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 2,
            },
            "prompt_lookup_min=4 must be <=",
        ),
        ({"method": "draft_model", "num_speculative_tokens": 3}, "draft model's path"),
        ({"method": "ngram", "num_speculative_tokens": 3, "model": "/m"}, "no draft model"),
        (
            {
                "method": "draft_model",
                "model": "/m",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 3,
            },
            "'ngram' only",
        ),
        ({"method": "ngram", "num_speculative_tokens": 3, "acceptance": "typical"}, "acceptance"),
        ({"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 1}, ">= 2"),
    ],
)
def test_bad_values_raise_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(options)


def test_acceptance_rule():
    default = SpeculativeConfig("ngram", 3)
    assert resolve_acceptance(default, deterministic=True) == "exact"
    assert resolve_acceptance(default, deterministic=False) == "rejection"
    forced = SpeculativeConfig("ngram", 3, acceptance="exact")
    assert resolve_acceptance(forced, deterministic=False) == "exact"
