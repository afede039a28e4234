"""Speculative decoding parts, engine-independent: proposers (ngram; the Proposer boundary for
model-based ones), verification ops (exact, rejection, synthetic), SpeculativeConfig and
metrics."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Where each name lives, imported on first use: the command line's --help and the engine's
# config read a submodule (params, config) without importing torch through this package.
_WHERE = {
    "SpeculativeConfig": "minivllm.spec_decode.config",
    "resolve_acceptance": "minivllm.spec_decode.config",
    "synthetic_rates_for_length": "minivllm.spec_decode.config",
    "SpecDecodingStats": "minivllm.spec_decode.metrics",
    "NgramProposer": "minivllm.spec_decode.ngram",
    "DraftTokens": "minivllm.spec_decode.proposer",
    "ProposeInput": "minivllm.spec_decode.proposer",
    "Proposer": "minivllm.spec_decode.proposer",
    "VerifyOutput": "minivllm.spec_decode.verify",
    "position_keys": "minivllm.spec_decode.verify",
    "synthetic_conditional_rates": "minivllm.spec_decode.verify",
    "verify_exact": "minivllm.spec_decode.verify",
    "verify_rejection": "minivllm.spec_decode.verify",
    "verify_synthetic": "minivllm.spec_decode.verify",
}

if TYPE_CHECKING:
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


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
