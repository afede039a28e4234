"""SpeculativeConfig.from_dict: vLLM's keys and defaults, unknown keys (TypeError), bad values
(ValueError), the acceptance rule it resolves to, and vLLM's rejection_sample_method with its
synthetic acceptance rates (or length, resolved to rates)."""

from __future__ import annotations

import dataclasses

import pytest

from minivllm.spec_decode.config import (
    DEFAULT_DISABLE_BY_BATCH_SIZE,
    SpeculativeConfig,
    resolve_acceptance,
    synthetic_rates_for_length,
)

SYNTHETIC = {"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "synthetic"}


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


@pytest.mark.parametrize(
    "method, acceptance", [("strict", "exact"), ("probabilistic", "rejection")]
)
def test_rejection_sample_method_names_the_acceptance(method, acceptance):
    options = {"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": method}
    config = SpeculativeConfig.from_dict(options)
    assert config.acceptance == acceptance and config.synthetic_acceptance_rates is None
    both = SpeculativeConfig.from_dict({**options, "acceptance": acceptance})
    assert both == config
    assert resolve_acceptance(config, deterministic=acceptance != "exact") == acceptance


def test_synthetic_rates_and_length():
    rates = SpeculativeConfig.from_dict(
        {**SYNTHETIC, "synthetic_acceptance_rates": [1, 0.5, 0.5, 0]}
    )
    assert rates.acceptance == "synthetic"
    assert rates.synthetic_acceptance_rates == (1, 0.5, 0.5, 0)  # a tuple: frozen and hashable
    length = SpeculativeConfig.from_dict({**SYNTHETIC, "synthetic_acceptance_length": 2.5})
    assert length.synthetic_acceptance_rates == (1.0, 0.5, 0.0, 0.0)
    assert resolve_acceptance(length, deterministic=True) == "synthetic"
    direct = SpeculativeConfig.from_dict(
        {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "acceptance": "synthetic",
            "synthetic_acceptance_length": 2.5,
        }
    )
    assert direct == length
    assert (
        SpeculativeConfig(
            "ngram", 4, acceptance="synthetic", synthetic_acceptance_rates=(1.0, 0.5, 0.0, 0.0)
        )
        == length
    )


@pytest.mark.parametrize(
    "length, k, rates",
    [
        (2.5, 4, (1.0, 0.5, 0.0, 0.0)),
        (1.0, 4, (0.0, 0.0, 0.0, 0.0)),
        (1.5, 4, (0.5, 0.0, 0.0, 0.0)),
        (3, 4, (1.0, 1.0, 0.0, 0.0)),
        (5, 4, (1.0, 1.0, 1.0, 1.0)),  # k + 1: every draft, the schedule truncated to k
        (4.75, 4, (1.0, 1.0, 1.0, 0.75)),
        (2, 1, (1.0,)),
    ],
)
def test_length_to_rates_minimum_variance_schedule(length, k, rates):
    assert synthetic_rates_for_length(length, k) == pytest.approx(rates)
    # The schedule's mean acceptance length (the target's own token counted) is the length.
    assert 1 + sum(rates) == pytest.approx(length)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"rejection_sample_method": "typical"}, "rejection_sample_method must be one of"),
        (
            {"rejection_sample_method": "strict", "acceptance": "rejection"},
            r"acceptance='rejection' and rejection_sample_method='strict' disagree",
        ),
        (
            {**SYNTHETIC, "acceptance": "exact", "synthetic_acceptance_length": 2},
            r"acceptance='exact' and rejection_sample_method='synthetic' disagree",
        ),
        (SYNTHETIC, "needs synthetic_acceptance_rates or synthetic_acceptance_length"),
        (
            {
                **SYNTHETIC,
                "synthetic_acceptance_rates": [1, 1, 1, 1],
                "synthetic_acceptance_length": 5,
            },
            "not both",
        ),
        (
            {"synthetic_acceptance_rates": [1.0, 1.0, 1.0, 1.0]},
            "synthetic_acceptance_rates applies to rejection_sample_method 'synthetic'",
        ),
        (
            {"rejection_sample_method": "strict", "synthetic_acceptance_length": 2.0},
            "synthetic_acceptance_length applies to rejection_sample_method 'synthetic'",
        ),
        (
            {**SYNTHETIC, "synthetic_acceptance_rates": [1, 1, 1]},
            "num_speculative_tokens=4 entries",
        ),
        ({**SYNTHETIC, "synthetic_acceptance_rates": [1, 1, 1, 1.5]}, r"in \[0, 1\]"),
        ({**SYNTHETIC, "synthetic_acceptance_rates": [1, 1, 1, -0.1]}, r"in \[0, 1\]"),
        (
            {**SYNTHETIC, "synthetic_acceptance_rates": [1, float("nan"), 0, 0]},
            r"in \[0, 1\]",
        ),
        ({**SYNTHETIC, "synthetic_acceptance_rates": [0.5, 0.6, 0, 0]}, "non-increasing"),
        ({**SYNTHETIC, "synthetic_acceptance_rates": [1, True, 0, 0]}, "numbers"),
        ({**SYNTHETIC, "synthetic_acceptance_rates": "1,1,0,0"}, "numbers"),
        (
            {**SYNTHETIC, "synthetic_acceptance_length": 0.9},
            r"synthetic_acceptance_length .*\[1, 5\]",
        ),
        ({**SYNTHETIC, "synthetic_acceptance_length": 5.01}, "synthetic_acceptance_length"),
        ({**SYNTHETIC, "synthetic_acceptance_length": float("nan")}, "synthetic_acceptance_length"),
        ({**SYNTHETIC, "synthetic_acceptance_length": "2"}, "synthetic_acceptance_length"),
        (
            {**SYNTHETIC, "num_speculative_tokens": 0, "synthetic_acceptance_length": 1},
            "num_speculative_tokens must be >= 1",
        ),
    ],
)
def test_bad_synthetic_options_raise_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4, **options})


def test_direct_construction_checks_the_rates():
    with pytest.raises(ValueError, match="tuple"):
        SpeculativeConfig("ngram", 2, acceptance="synthetic", synthetic_acceptance_rates=[1, 0])
    with pytest.raises(ValueError, match="needs synthetic_acceptance_rates"):
        SpeculativeConfig("ngram", 2, acceptance="synthetic")
