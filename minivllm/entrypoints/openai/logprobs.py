"""Logprobs in each API's own shape (completions: parallel lists; chat: content entries).

Entries keep the engine's dict order (the sampled token first, then the top ranks), and
clamp -inf to -9999.0, as vLLM does.
"""

from __future__ import annotations

from minivllm.outputs import LogprobsDict


def _value(logprob: float) -> float:
    return max(logprob, -9999.0)


def completion_logprobs(
    token_ids: list[int],
    logprobs: list[LogprobsDict | None],
    num_top: int,
    tokenizer,
    text_offset: int = 0,
) -> dict:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"} for the given tokens; a
    None entry (the first prompt token under echo) has no logprob."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, entry in zip(token_ids, logprobs):
        if entry is None or token_id not in entry:
            token = tokenizer.decode([token_id])
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            token = entry[token_id].decoded_token or ""
            token_logprobs.append(_value(entry[token_id].logprob))
            top_logprobs.append(
                {
                    (lp.decoded_token or ""): _value(lp.logprob)
                    for i, lp in enumerate(entry.values())
                    if i <= num_top
                }
            )
        tokens.append(token)
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def chat_logprobs(token_ids: list[int], logprobs: list[LogprobsDict], num_top: int) -> dict:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}"""
    content = []
    for token_id, entry in zip(token_ids, logprobs):
        sampled = entry[token_id]
        token = sampled.decoded_token or ""
        content.append(
            {
                "token": token,
                "logprob": _value(sampled.logprob),
                "bytes": list(token.encode("utf-8", errors="replace")),
                "top_logprobs": [
                    {
                        "token": lp.decoded_token or "",
                        "logprob": _value(lp.logprob),
                        "bytes": list((lp.decoded_token or "").encode("utf-8", errors="replace")),
                    }
                    for i, lp in enumerate(entry.values())
                    if i < num_top
                ],
            }
        )
    return {"content": content}


def top_ranks(entry: LogprobsDict, token_id: int, num_top: int) -> LogprobsDict:
    """The entry the engine gives with num_top top ranks, from one it gave with as many or more:
    the token's own, then ranks 1 .. num_top (one request can ask for prompt tokens' top
    ranks twice, for echo's logprobs and for prompt_logprobs; the engine scores the larger)."""
    return {t: lp for t, lp in entry.items() if t == token_id or lp.rank <= num_top}


def prompt_logprobs(
    token_ids: list[int], entries: list[LogprobsDict | None] | None, num_top: int
) -> list[dict[str, dict] | None]:
    """vLLM's `prompt_logprobs`: per prompt token None (the first, which nothing predicts) or
    {"token id": {"logprob", "rank", "decoded_token"}}, the token's own entry and the top
    num_top."""
    result: list[dict[str, dict] | None] = []
    for token_id, entry in zip(token_ids, entries or [None] * len(token_ids)):
        if entry is None:
            result.append(None)
            continue
        result.append(
            {
                str(t): {
                    "logprob": _value(lp.logprob),
                    "rank": lp.rank,
                    "decoded_token": lp.decoded_token,
                }
                for t, lp in top_ranks(entry, token_id, num_top).items()
            }
        )
    return result
