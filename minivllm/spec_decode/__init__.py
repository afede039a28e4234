"""Speculative decoding parts, engine-independent: proposers (ngram; the Proposer boundary for
model-based ones), verification ops (exact, rejection), SpeculativeConfig and metrics."""

from minivllm.spec_decode.config import SpeculativeConfig, resolve_acceptance
from minivllm.spec_decode.metrics import SpecDecodingStats
from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import DraftTokens, ProposeInput, Proposer
from minivllm.spec_decode.verify import VerifyOutput, position_keys, verify_exact, verify_rejection

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
    "verify_exact",
    "verify_rejection",
]
