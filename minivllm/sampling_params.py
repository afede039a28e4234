"""SamplingParams: vLLM's names and meanings, validated on construction."""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass, field, fields

from minivllm.pooling.params import PoolingParams
from minivllm.structured_output.params import StructuredOutputsParams

# vLLM's default VLLM_MAX_N_SEQUENCES: each sample is a request of its own.
MAX_N = 16384
logger = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# vLLM's floor for a nonzero temperature: logits / 1e-40 overflow float32 (NaN probabilities),
# and 1e-300 rounds to a float32 0 that the sampler would not treat as greedy.
MIN_TEMPERATURE = 1e-2
# float32's largest and smallest normal: the sampler holds temperature and repetition penalty
# in float32, where 1e300 would be inf and 1e-300 a 0 (0 / 0: a NaN logit).
_F32_MAX, _F32_TINY = 3.4028234663852886e38, 1.1754943508222875e-38
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_INT_FIELDS = ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs")
_OPTIONAL_INT_FIELDS = ("seed", "max_tokens", "logprobs", "prompt_logprobs")


@dataclass
class SamplingParams:
    """How to sample one request. Names and meanings follow vLLM.

    temperature 0 is greedy (one in (0, 0.01) becomes 0.01, as in vLLM); top_k 0 or -1 means
    off; penalties of 0 (presence, frequency) and 1 (repetition) are off. `logprobs=k` returns
    the sampled token plus the top k for each generated token; `prompt_logprobs=k` the same
    for prompt tokens.
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
    # False: no text (vLLM's): the output's text stays "" and logprob entries' decoded_token
    # None, where only the token ids are read (benchmarks, RL rollouts). Stop strings need it.
    detokenize: bool = True
    # token id -> a number added to its logit before penalties, temperature and filters
    # (OpenAI's logit_bias; +-100 effectively forces or bans a token; clamped to [-100, 100]
    # as the OpenAI API and vLLM's server do: 1e300 would be an inf logit, NaN probabilities).
    logit_bias: dict[int, float] | None = None
    # Only these token ids may be sampled (vLLM's; every other logit is -inf before penalties,
    # temperature and filters; logprobs stay those of the raw logits). Not with
    # structured_outputs, whose mask could leave no token.
    allowed_token_ids: list[int] | None = None
    # Words never to write (vLLM's): a word's last token is banned where the output ends in
    # the tokens before it, the word tokenized as it is and after a space (its ids:
    # bad_words_token_ids, which the frontend fills).
    bad_words: list[str] | None = None
    # Most tokens inside a <think> block (vLLM's thinking_token_budget): past them the block's
    # end marker is forced (engine/runner/sampling/thinking_budget.py).
    thinking_token_budget: int | None = None
    # The output matches a JSON schema, regex, choice or grammar (vLLM's name and type;
    # docs/structured_outputs.md).
    structured_outputs: StructuredOutputsParams | None = None
    # A pooling request (minivllm/pooling/): prefill-only, one greedy token (max_tokens=1,
    # which ends it), and its output is the pooled vector or score of its prompt. Set by
    # LLM.embed / LLM.score and the pooling routes.
    pooling: PoolingParams | None = None
    # Filled by the engine from the tokenizer / generation_config.json, not by users.
    eos_token_ids: list[int] = field(default_factory=list)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    think_marker_ids: list[list[int]] = field(default_factory=list)  # <think>, </think>

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        self.bad_words = list(self.bad_words) if self.bad_words else None
        if self.top_k == -1:
            self.top_k = 0
        if self.seed == -1:  # vLLM: -1 means unseeded
            self.seed = None
        self._validate_types()
        self._validate_ranges()
        self._normalize_structured_outputs()
        if self.logit_bias:
            self.logit_bias = {t: min(100.0, max(-100.0, b)) for t, b in self.logit_bias.items()}
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            logger.warning(
                "temperature %s is below %s, where float32 logits overflow; using %s (as vLLM)",
                self.temperature, MIN_TEMPERATURE, MIN_TEMPERATURE,
            )  # fmt: skip
            self.temperature = MIN_TEMPERATURE
        self.temperature = min(self.temperature, _F32_MAX)
        self.repetition_penalty = min(max(self.repetition_penalty, _F32_TINY), _F32_MAX)

    def _validate_types(self) -> None:
        """Every number a finite float or an int64 (the sampler's tensors hold them)."""
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_real(value):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_INT_FIELDS:
                continue
            if not _is_int(value):
                raise TypeError(f"{name} must be an integer, got {value!r}")
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueError(f"{name} must fit in 64 bits (|{name}| < 2**63), got {value}")
        if not isinstance(self.detokenize, bool):
            raise TypeError(f"detokenize must be a bool, got {self.detokenize!r}")
        if self.stop and not self.detokenize:
            raise ValueError(
                "stop strings are only supported when detokenize is True (as in vLLM); "
                "stop_token_ids end an output without text"
            )
        for name, values, kind in (
            ("stop", self.stop, str),
            ("stop_token_ids", self.stop_token_ids, int),
        ):
            if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
                raise TypeError(f"{name} must be a list of {kind.__name__}, got {values!r}")
        if self.allowed_token_ids is not None:
            if not all(_is_int(t) for t in self.allowed_token_ids):
                raise TypeError(
                    f"allowed_token_ids must be a list of token ids, got {self.allowed_token_ids!r}"
                )
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids is empty: no token could be sampled")
            if self.structured_outputs is not None:
                raise ValueError(
                    "allowed_token_ids cannot be combined with structured_outputs (the grammar "
                    "could allow none of them)"
                )
        if self.pooling is not None:
            if not isinstance(self.pooling, PoolingParams):
                raise TypeError(f"pooling must be PoolingParams, got {type(self.pooling).__name__}")
            if self.max_tokens != 1 or self.n != 1:
                raise ValueError("a pooling request takes n=1 and max_tokens=1")
        budget = self.thinking_token_budget
        if budget is not None and (not _is_int(budget) or not 0 <= budget < 2**63):
            raise ValueError(f"thinking_token_budget must be an integer >= 0, got {budget!r}")
        for word in self.bad_words or []:
            if not isinstance(word, str):
                raise TypeError(f"bad_words must be a list of str, got {self.bad_words!r}")
            if not word.strip():
                raise ValueError(f"bad_words holds an empty word: {self.bad_words!r}")
        for token_id, bias in (self.logit_bias or {}).items():
            if not _is_int(token_id) or not _is_real(bias):
                raise TypeError(
                    f"logit_bias must map token ids to numbers, got {self.logit_bias!r}"
                )
            if not math.isfinite(bias):
                raise ValueError(f"logit_bias values must be finite, got {bias} for {token_id}")

    def _normalize_structured_outputs(self) -> None:
        """A schema given as a pydantic class is kept as its JSON text: the params cross
        process boundaries (pickled), and a class defined in a script would not unpickle."""
        so = self.structured_outputs
        if so is None:
            return
        if not isinstance(so, StructuredOutputsParams):
            raise TypeError(
                f"structured_outputs must be StructuredOutputsParams, got {type(so).__name__}"
            )
        if isinstance(so.json, type):
            self.structured_outputs = StructuredOutputsParams(json=so.spec_key().text)

    def _validate_ranges(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(1 <= self.n <= MAX_N, f"n must be in [1, {MAX_N}], got {self.n}")
        check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        check(self.top_k >= 0, f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        check(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            check(-2.0 <= value <= 2.0, f"{name} must be in [-2, 2], got {value}")
        check(
            self.repetition_penalty > 0.0,
            f"repetition_penalty must be > 0, got {self.repetition_penalty}",
        )
        check(
            self.max_tokens is None or self.max_tokens >= 1,
            f"max_tokens must be at least 1, got {self.max_tokens}",
        )
        check(self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}")
        check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(value is None or value >= 0, f"{name} must be None or >= 0, got {value}")
        check(all(self.stop), f"stop must not contain an empty string, got {self.stop}")
        check(
            all(0 <= t <= _INT64_MAX for t in self.stop_token_ids),
            f"stop_token_ids must be in [0, 2**63), got {self.stop_token_ids}",
        )

    def derive(self, **changes: object) -> SamplingParams:
        """A copy with engine-set fields changed (eos_token_ids; a sample's n, seed and
        prompt_logprobs), not validated again: these params were, where they were made, and
        a frontend's changes keep them valid. dataclasses.replace() would validate anew."""
        unknown = set(changes) - _FIELD_NAMES
        assert not unknown, f"not SamplingParams fields: {sorted(unknown)}"
        derived = copy.copy(self)
        derived.__dict__.update(changes)
        return derived

    @property
    def has_penalties(self) -> bool:
        """Whether a presence, frequency or repetition penalty is on."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_engine_limits(params: SamplingParams, max_logprobs: int, vocab_size: int) -> None:
    """The checks that need the engine (ValueError): logit_bias and allowed_token_ids token
    ids inside the vocabulary; vLLM's cap on logprobs and prompt_logprobs, the engine option
    max_logprobs (-1: the vocabulary size)."""
    for name, token_ids in (
        ("logit_bias", params.logit_bias or {}),
        ("allowed_token_ids", params.allowed_token_ids or []),
    ):
        for token_id in token_ids:
            if not 0 <= token_id < vocab_size:
                raise ValueError(
                    f"{name} token id {token_id} is outside the vocabulary [0, {vocab_size})"
                )
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and value > limit:
            raise ValueError(
                f"{name}={value} is more than this engine allows (max_logprobs={limit}); "
                "start the engine with a larger max_logprobs to ask for more"
            )
