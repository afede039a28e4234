"""The compile's probe of a grammar's first tokens: llguidance checks some of its limits only
as it advances (2,000 alternatives in a parser row, the lexer's count of regex expressions), so
a grammar that builds and gives a first mask can still fail at a request's second token. A
short walk at compile time finds those failures, so that they are refused at validation."""

from __future__ import annotations

import time

import llguidance
import numpy as np

# The walk's length and its time budget (the lexer states it builds are the template's, kept
# for the requests that follow: the walk's time is not lost).
PROBE_STEPS = 32
PROBE_BUDGET_S = 1.0


def probe_token_ids(tokenizer: llguidance.LLTokenizer) -> np.ndarray:
    """bool [vocab_size]: the tokens the walk prefers, those that spell something other than
    whitespace (a walk of whitespace in a JSON grammar would never reach its values).
    A pass over the vocabulary, once per backend."""
    preferred = np.zeros(tokenizer.vocab_size, dtype=bool)
    for token_id in range(tokenizer.vocab_size):
        if not tokenizer.is_special_token(token_id):
            preferred[token_id] = bool(tokenizer.decode_bytes([token_id]).strip())
    return preferred


def probe_error(template: llguidance.LLMatcher, preferred: np.ndarray) -> str | None:
    """llguidance's error on a walk of up to PROBE_STEPS tokens from template (a deep copy
    walks; template stays at the start), or None. Each step takes the lowest allowed
    preferred token (any allowed token if none is preferred)."""
    matcher = template.deep_copy()
    deadline = time.monotonic() + PROBE_BUDGET_S
    for _ in range(PROBE_STEPS):
        if matcher.is_stopped() or time.monotonic() > deadline:
            break
        words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        if matcher.is_error():
            break
        allowed = np.unpackbits(words, bitorder="little")[: len(preferred)].astype(bool)
        candidates = np.flatnonzero(allowed & preferred)
        if not len(candidates):
            candidates = np.flatnonzero(allowed)
        if not len(candidates):
            break
        matcher.consume_token(int(candidates[0]))
    return matcher.get_error() if matcher.is_error() else None
