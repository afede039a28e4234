"""Logprobs in each API's own shape (completions: parallel lists; chat: content entries).

Entries keep the engine's dict order (the sampled token first, then the top ranks), and
clamp -inf to -9999.0, as vLLM does. With as_ids (vLLM's return_tokens_as_token_ids) every
token is written "token_id:{id}": a token that is no whole UTF-8 text (part of a character)
stays identifiable.
"""

from __future__ import annotations

from minivllm.outputs import LogprobsDict


def _value(logprob: float) -> float:
    return max(logprob, -9999.0)


def _token(token_id: int, decoded: str | None, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else (decoded or "")


def completion_logprobs(
    token_ids: list[int],
    logprobs: list[LogprobsDict | None],
    num_top: int,
    tokenizer,
    text_offset: int = 0,
    as_ids: bool = False,
) -> dict:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"} for the given tokens; a
    None entry (the first prompt token under echo) has no logprob."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, entry in zip(token_ids, logprobs):
        if entry is None or token_id not in entry:
            token = _token(token_id, None if as_ids else tokenizer.decode([token_id]), as_ids)
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            token = _token(token_id, entry[token_id].decoded_token, as_ids)
            token_logprobs.append(_value(entry[token_id].logprob))
            top_logprobs.append(
                {
                    _token(t, lp.decoded_token, as_ids): _value(lp.logprob)
                    for i, (t, lp) in enumerate(entry.items())
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


def chat_logprobs(
    token_ids: list[int], logprobs: list[LogprobsDict], num_top: int, as_ids: bool = False
) -> dict:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}"""

    def item(token_id: int, decoded: str | None, logprob: float) -> dict:
        token = _token(token_id, decoded, as_ids)
        bytes_ = list(token.encode("utf-8", errors="replace"))
        return {"token": token, "logprob": _value(logprob), "bytes": bytes_}

    content = []
    for token_id, entry in zip(token_ids, logprobs):
        sampled = entry[token_id]
        top = [item(t, lp.decoded_token, lp.logprob) for t, lp in list(entry.items())[:num_top]]
        content.append(
            {**item(token_id, sampled.decoded_token, sampled.logprob), "top_logprobs": top}
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
