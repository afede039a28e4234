"""Speculative decoding parts, engine-independent: proposers (ngram; the Proposer boundary for
model-based ones), verification ops (exact, rejection, synthetic), SpeculativeConfig and
metrics."""

from minivllm.spec_decode.config import (
    SpeculativeConfig,
    resolve_acceptance,
    synthetic_rates_for_length,
)
from minivllm.spec_decode.metrics import SpecDecodingStats
from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import DraftTokens, ProposeInput, Proposer
from minivllm.spec_decode.verify import (
    VerifyOutput,
    position_keys,
    synthetic_conditional_rates,
    verify_exact,
    verify_rejection,
    verify_synthetic,
)

__all__ = [
    "DraftTokens",
    "NgramProposer",
    "ProposeInput",
    "Proposer",
    "SpecDecodingStats",
    "SpeculativeConfig",
    "VerifyOutput",
    "position_keys",
    "resolve_acceptance",
    "synthetic_conditional_rates",
    "synthetic_rates_for_length",
    "verify_exact",
    "verify_rejection",
    "verify_synthetic",
]
