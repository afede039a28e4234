"""SpeculativeConfig: the frozen, validated speculative-decoding options (vLLM's names), built
from the `speculative_config={...}` dict a user passes, and the acceptance rule it resolves to
(with vLLM's synthetic acceptance rates for benchmarks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

Method = Literal["ngram", "draft_model"]
Acceptance = Literal["exact", "rejection", "synthetic"]
METHODS: tuple[str, ...] = ("ngram", "draft_model")
ACCEPTANCES: tuple[str, ...] = ("exact", "rejection", "synthetic")
# vLLM's `rejection_sample_method` values and the acceptance each one is here.
REJECTION_SAMPLE_METHODS: dict[str, Acceptance] = {
    "strict": "exact",
    "probabilistic": "rejection",
    "synthetic": "synthetic",
}
# from_dict's keys that are not fields: vLLM's names, resolved into fields there.
_ALIAS_KEYS = ("rejection_sample_method", "synthetic_acceptance_length")
# vLLM's default n-gram window when neither bound is given.
DEFAULT_PROMPT_LOOKUP = 5
# Above this many running requests a step does not speculate: where n-gram drafting stopped
# paying on real text on the H200 (docs/performance.md, "Speculation and batch size").
# vLLM's default is never; None here means the same.
DEFAULT_DISABLE_BY_BATCH_SIZE = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """What to draft and how to verify it.

    method: "ngram" (prompt lookup, no model) or "draft_model" (a smaller model at `model`).
    num_speculative_tokens: k, the most draft tokens per request per step (each request gets
    k + 1 query slots). prompt_lookup_max / prompt_lookup_min: the n-gram lengths tried,
    longest first (ngram only). acceptance: "exact" (a draft token is kept iff it is the
    token the target itself samples), "rejection" (Leviathan/Chen), "synthetic" (benchmarks
    only: draft i is kept with a forced probability, whatever the target says; the output is
    not the target's) or None: resolve_acceptance picks. disable_by_batch_size: a step does
    not speculate while more than this many requests are running or waiting (None: never
    disabled). synthetic_acceptance_rates (synthetic only, and then required): k unconditional
    rates, entry i the probability that the first i + 1 drafts are all accepted
    (non-increasing, in [0, 1]).
    """

    method: Method
    num_speculative_tokens: int
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP
    model: str | None = None
    acceptance: Acceptance | None = None
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE
    synthetic_acceptance_rates: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        _check_num_speculative_tokens(self.num_speculative_tokens)
        _check_int("prompt_lookup_max", self.prompt_lookup_max, 1)
        _check_int("prompt_lookup_min", self.prompt_lookup_min, 1)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min={self.prompt_lookup_min} must be <= "
                f"prompt_lookup_max={self.prompt_lookup_max}"
            )
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise ValueError("method 'draft_model' needs `model`: the draft model's path")
        if self.method == "ngram" and self.model not in (None, "ngram"):
            raise ValueError(f"method 'ngram' takes no draft model, got model={self.model!r}")
        if self.acceptance is not None and self.acceptance not in ACCEPTANCES:
            raise ValueError(
                f"acceptance must be one of {ACCEPTANCES} or None, got {self.acceptance!r}"
            )
        self._check_synthetic_rates()
        if self.disable_by_batch_size is not None:
            # vLLM's bound: below 2 no step would ever speculate.
            _check_int("disable_by_batch_size", self.disable_by_batch_size, 2)

    def _check_synthetic_rates(self) -> None:
        rates, k = self.synthetic_acceptance_rates, self.num_speculative_tokens
        if self.acceptance != "synthetic":
            if rates is not None:
                raise ValueError(
                    "synthetic_acceptance_rates applies to rejection_sample_method 'synthetic' "
                    f"(acceptance 'synthetic') only, got acceptance={self.acceptance!r}"
                )
            return
        if rates is None:
            raise ValueError(
                "rejection_sample_method 'synthetic' needs synthetic_acceptance_rates or "
                "synthetic_acceptance_length"
            )
        if not isinstance(rates, tuple) or not all(_is_number(r) for r in rates):
            raise ValueError(
                f"synthetic_acceptance_rates must be a tuple (in a dict: a list) of numbers, "
                f"got {rates!r}"
            )
        if len(rates) != k:
            raise ValueError(
                f"synthetic_acceptance_rates must have num_speculative_tokens={k} entries, "
                f"got {len(rates)}"
            )
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"synthetic_acceptance_rates must lie in [0, 1], got {list(rates)}")
        if any(later > earlier for earlier, later in zip(rates, rates[1:])):
            raise ValueError(
                "synthetic_acceptance_rates must be non-increasing (entry i is the probability "
                f"that the first i + 1 drafts are all accepted), got {list(rates)}"
            )

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> SpeculativeConfig:
        """From a user's `speculative_config` dict (vLLM's keys). Unknown keys raise TypeError
        naming them; bad values raise ValueError.

        As in vLLM: `method` may be left out when `model` says it ("ngram" or a path, which
        means "draft_model"); for ngram, one given lookup bound sets the other;
        `rejection_sample_method` names the acceptance ("strict": "exact", "probabilistic":
        "rejection", "synthetic"); `synthetic_acceptance_length` stands for the rates of
        synthetic_rates_for_length.
        """
        if not isinstance(options, Mapping):
            raise TypeError(f"speculative_config must be a dict, got {type(options).__name__}")
        known = {f.name for f in fields(cls)} | set(_ALIAS_KEYS)
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"unknown speculative_config option(s) {unknown}; known: {sorted(known)}"
            )
        values = dict(options)
        if "num_speculative_tokens" not in values:
            raise ValueError("speculative_config needs num_speculative_tokens")
        if values.get("method") is None:
            model = values.get("model")
            if model is None:
                raise ValueError("speculative_config needs `method` or `model`")
            values["method"] = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
        if values["method"] == "[ngram]":
            values["method"] = "ngram"
        if values.get("model") == "[ngram]":
            values["model"] = "ngram"
        lookup_max = values.pop("prompt_lookup_max", None)
        lookup_min = values.pop("prompt_lookup_min", None)
        if values["method"] != "ngram" and (lookup_max, lookup_min) != (None, None):
            raise ValueError("prompt_lookup_max / prompt_lookup_min apply to method 'ngram' only")
        lookup_max = lookup_min if lookup_max is None else lookup_max
        lookup_min = lookup_max if lookup_min is None else lookup_min
        if lookup_max is not None:
            values.update(prompt_lookup_max=lookup_max, prompt_lookup_min=lookup_min)
        values["acceptance"] = _acceptance_from(
            values.get("acceptance"), values.pop("rejection_sample_method", None)
        )
        values["synthetic_acceptance_rates"] = _synthetic_rates_from(
            values.get("synthetic_acceptance_rates"),
            values.pop("synthetic_acceptance_length", None),
            values["acceptance"],
            values["num_speculative_tokens"],
        )
        return cls(**values)


def synthetic_rates_for_length(length: float, num_speculative_tokens: int) -> tuple[float, ...]:
    """The unconditional rates whose mean acceptance length (the target's own token counted)
    is `length`, by the minimum-variance schedule (vLLM's): with d = length - 1, the first
    floor(d) drafts are always accepted, the next with probability d - floor(d), none after.
    length must lie in [1, num_speculative_tokens + 1]."""
    k = num_speculative_tokens
    _check_num_speculative_tokens(k)
    if not _is_number(length) or not 1.0 <= length <= k + 1:
        raise ValueError(
            f"synthetic_acceptance_length must be a number in [1, num_speculative_tokens + 1] "
            f"= [1, {k + 1}], got {length!r}"
        )
    d = float(length) - 1.0
    f = math.floor(d)
    return tuple(([1.0] * f + [d - f] + [0.0] * (k - f - 1))[:k])


def resolve_acceptance(config: SpeculativeConfig, deterministic: bool) -> Acceptance:
    """The acceptance rule in force: the configured one ("synthetic" only when asked for), else
    "exact" when the engine is deterministic (a request's tokens must not change with
    speculation) and "rejection" otherwise (more tokens accepted, the same distribution)."""
    if config.acceptance is not None:
        return config.acceptance
    return "exact" if deterministic else "rejection"


def _acceptance_from(acceptance: Any, rejection_sample_method: Any) -> Any:
    """The acceptance that `acceptance` and vLLM's `rejection_sample_method` name (either may
    be None); ValueError if they name different ones."""
    if rejection_sample_method is None:
        return acceptance
    if rejection_sample_method not in REJECTION_SAMPLE_METHODS:
        raise ValueError(
            f"rejection_sample_method must be one of {tuple(REJECTION_SAMPLE_METHODS)}, "
            f"got {rejection_sample_method!r}"
        )
    named = REJECTION_SAMPLE_METHODS[rejection_sample_method]
    if acceptance is not None and acceptance != named:
        raise ValueError(
            f"acceptance={acceptance!r} and rejection_sample_method={rejection_sample_method!r} "
            f"disagree (rejection_sample_method {rejection_sample_method!r} is acceptance "
            f"{named!r}); give one of them"
        )
    return named


def _synthetic_rates_from(
    rates: Any, length: Any, acceptance: Any, num_speculative_tokens: Any
) -> Any:
    """synthetic_acceptance_rates from a user's rates (a list) or mean acceptance length;
    ValueError for a length given without synthetic acceptance or with rates. The rates
    themselves are checked by SpeculativeConfig."""
    if length is None:
        return tuple(rates) if isinstance(rates, list) else rates
    if acceptance != "synthetic":
        raise ValueError(
            "synthetic_acceptance_length applies to rejection_sample_method 'synthetic' "
            f"(acceptance 'synthetic') only, got acceptance={acceptance!r}"
        )
    if rates is not None:
        raise ValueError("give synthetic_acceptance_rates or synthetic_acceptance_length, not both")
    return synthetic_rates_for_length(length, num_speculative_tokens)


def _check_num_speculative_tokens(value: Any) -> None:
    _check_int("num_speculative_tokens", value, 1)


def _is_number(value: Any) -> bool:
    # bool is an int subclass; True as a rate is a mistake.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int) -> None:
    # bool is an int subclass; True as a count is a mistake.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
