"""SpeculativeConfig: the frozen, validated speculative-decoding options (vLLM's names), built
from the `speculative_config={...}` dict a user passes, and the acceptance rule it resolves to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

Method = Literal["ngram", "draft_model"]
Acceptance = Literal["exact", "rejection"]
METHODS: tuple[str, ...] = ("ngram", "draft_model")
ACCEPTANCES: tuple[str, ...] = ("exact", "rejection")
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
    token the target itself samples), "rejection" (Leviathan/Chen) or None: resolve_acceptance
    picks. disable_by_batch_size: a step does not speculate while more than this many requests
    are running or waiting (None: never disabled).
    """

    method: Method
    num_speculative_tokens: int
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP
    model: str | None = None
    acceptance: Acceptance | None = None
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
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
        if self.disable_by_batch_size is not None:
            # vLLM's bound: below 2 no step would ever speculate.
            _check_int("disable_by_batch_size", self.disable_by_batch_size, 2)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> SpeculativeConfig:
        """From a user's `speculative_config` dict (vLLM's keys). Unknown keys raise TypeError
        naming them; bad values raise ValueError.

        As in vLLM: `method` may be left out when `model` says it ("ngram" or a path, which
        means "draft_model"); for ngram, one given lookup bound sets the other.
        """
        if not isinstance(options, Mapping):
            raise TypeError(f"speculative_config must be a dict, got {type(options).__name__}")
        known = {f.name for f in fields(cls)}
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
        return cls(**values)


def resolve_acceptance(config: SpeculativeConfig, deterministic: bool) -> Acceptance:
    """The acceptance rule in force: the configured one, else "exact" when the engine is
    deterministic (a request's tokens must not change with speculation) and "rejection"
    otherwise (more tokens accepted, the same distribution)."""
    if config.acceptance is not None:
        return config.acceptance
    return "exact" if deterministic else "rejection"


def _check_int(name: str, value: Any, minimum: int) -> None:
    # bool is an int subclass; True as a count is a mistake.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
