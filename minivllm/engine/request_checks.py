"""The checks a request must pass before it reaches a scheduler. One function, run once per
request by its frontend before anything is queued (LLM.validate_request, AsyncLLM.validate),
against the CoreInfo the engine reports; the core trusts what passes (EngineRequest).
"""

from __future__ import annotations

from minivllm.engine.stats import CoreInfo
from minivllm.sampling_params import SamplingParams, check_engine_limits


def check_request(
    prompt_token_ids: list[int], params: SamplingParams, info: CoreInfo, max_logprobs: int
) -> None:
    """Raises ValueError for a request the engine could never serve: an empty prompt, a token
    outside the vocabulary, limits of the engine (logprobs, logit_bias ids), a prompt that
    leaves no room in max_model_len, or more KV blocks than the cache holds."""
    num_prompt = len(prompt_token_ids)
    if num_prompt == 0:
        raise ValueError("the prompt is empty: give at least one token")
    # Before the walk over the ids: a too-long prompt costs no per-token work.
    if num_prompt >= info.max_model_len:
        raise ValueError(
            f"This model's maximum context length is {info.max_model_len} tokens, and the "
            f"prompt has {num_prompt} tokens: it must be shorter, to leave room for at least "
            "one generated token"
        )
    for token_id in prompt_token_ids:
        if not isinstance(token_id, int) or not 0 <= token_id < info.vocab_size:
            raise ValueError(
                f"prompt token id {token_id!r} is outside the vocabulary [0, {info.vocab_size})"
            )
    check_engine_limits(params, max_logprobs, info.vocab_size)
    max_tokens = params.max_tokens if params.max_tokens is not None else info.max_model_len
    worst_case = min(num_prompt + max_tokens, info.max_model_len)
    blocks_needed = -(-worst_case // info.block_size)
    if blocks_needed > info.num_blocks:
        raise ValueError(
            f"the request needs up to {worst_case} tokens ({blocks_needed} KV blocks) but "
            f"the KV cache holds only {info.num_blocks} blocks of {info.block_size}"
        )


def check_cache_salt(cache_salt: object) -> str | None:
    """A request's cache salt: None, or a non-empty string (as vLLM); else a ValueError."""
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {cache_salt!r}")
    return cache_salt


def check_priority(priority: object, policy: str) -> int:
    """A request's priority: an int64 (a lower value first), other than 0 only under the
    "priority" scheduling policy (as vLLM); else a ValueError."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if not -(2**63) <= priority < 2**63:
        raise ValueError(f"priority must fit in 64 bits, got {priority}")
    if priority != 0 and policy != "priority":
        raise ValueError(
            f"priority {priority} needs the priority scheduling policy "
            "(scheduling_policy='priority', --scheduling-policy priority)"
        )
    return priority
