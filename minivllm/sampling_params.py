"""SamplingParams: vLLM's names and meanings, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """How to sample one request. Names and meanings follow vLLM.

    temperature 0 is greedy; top_k 0 or -1 means off; penalties of 0 (presence, frequency)
    and 1 (repetition) are off. `logprobs=k` returns the sampled token plus the top k for
    each generated token; `prompt_logprobs=k` the same for prompt tokens.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # Filled by the engine from the tokenizer / generation_config.json, not by users.
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(isinstance(self.n, int) and self.n >= 1, f"n must be an integer >= 1, got {self.n}")
        check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        check(
            isinstance(self.top_k, int) and self.top_k >= 0,
            f"top_k must be -1 (off), 0 (off) or a positive integer, got {self.top_k}",
        )
        check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        check(
            -2.0 <= self.presence_penalty <= 2.0,
            f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
        )
        check(
            -2.0 <= self.frequency_penalty <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
        )
        check(
            self.repetition_penalty > 0.0,
            f"repetition_penalty must be > 0, got {self.repetition_penalty}",
        )
        check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            f"max_tokens must be at least 1, got {self.max_tokens}",
        )
        check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            f"min_tokens must be >= 0, got {self.min_tokens}",
        )
        check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(
                value is None or (isinstance(value, int) and value >= 0),
                f"{name} must be None or an integer >= 0, got {value}",
            )
        check(
            all(isinstance(s, str) and s for s in self.stop),
            f"stop must be a list of non-empty strings, got {self.stop}",
        )
        check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            f"stop_token_ids must be non-negative integers, got {self.stop_token_ids}",
        )
        check(
            self.seed is None or isinstance(self.seed, int),
            f"seed must be an integer or None, got {self.seed!r}",
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
