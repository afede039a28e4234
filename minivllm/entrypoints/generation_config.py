"""Reads generation_config.json: EOS ids and default sampling values, as vLLM applies them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

# generation_config.json keys that become SamplingParams defaults (vLLM's list), by the name
# they take there: transformers' max_new_tokens is max_tokens.
_SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    sampling: dict[str, Any] = field(default_factory=dict)


def read_generation_defaults(model_dir: str, tokenizer) -> GenerationDefaults:
    """EOS ids are the tokenizer's EOS plus generation_config.json's (Llama 3 Instruct stops
    on <|eot_id|> only because the latter lists it)."""
    eos: list[int] = []
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    sampling: dict[str, Any] = {}
    path = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            gen = json.load(f)
        gen_eos = gen.get("eos_token_id")
        for token_id in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if isinstance(token_id, int) and token_id not in eos:
                eos.append(token_id)
        sampling = {
            name: gen[key] for key, name in _SAMPLING_KEYS.items() if gen.get(key) is not None
        }
    return GenerationDefaults(tuple(eos), sampling)
