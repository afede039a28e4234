"""A step's per-row logit edits as padded device tensors: the ids banned (min_tokens, bad
words), forced (a thinking budget's end), biased (logit_bias) and allowed (allowed_token_ids).
None where no row of the step has one, so that a plain step builds nothing."""

from __future__ import annotations

import torch

from minivllm.engine.runner.device_inputs import list_to_device
from minivllm.engine.runner.sampling.request_state import RequestState
from minivllm.sampling_params import SamplingParams


def suppressed_token_ids(
    states: list[RequestState],
    num_before: list[int],
    outputs: list[list[int]] | None,
    device: torch.device,
    forced: list[int | None] | None = None,
) -> torch.Tensor | None:
    """[N, max_num_suppressed] ids banned this step by min_tokens and (where outputs: some
    request has bad words) bad words, or None when none are. num_before: per row, the output
    tokens before it (drafts before its position too); outputs: per row, those tokens. A row
    with a forced token (forced: per row) bans nothing: its one token must stay possible."""
    rows: list[list[int]] = []
    for row, s in enumerate(states):
        banned: list[int] = []
        if forced is not None and forced[row] is not None:
            rows.append(banned)
            continue
        if num_before[row] < s.params.min_tokens:
            banned = list(s.banned_early)
        if outputs is not None:
            banned += banned_by_bad_words(s.params.bad_words_token_ids, outputs[row])
        rows.append(banned)
    return padded(rows, device) if any(rows) else None


def banned_by_bad_words(words: list[list[int]], output: list[int]) -> list[int]:
    """Each bad word's last token where the output ends in the tokens before it (a one-token
    word always)."""
    banned = []
    for word in words:
        before = len(word) - 1
        if before <= len(output) and output[len(output) - before :] == word[:-1]:
            banned.append(word[-1])
    return banned


def logit_bias(
    params: list[SamplingParams], device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """[N, max_num_biased] ids (int64) and values (float32) of the rows' logit_bias, padded
    with id 0 and value 0.0 (adding 0 changes nothing); (None, None) when no row has one."""
    if not any(p.logit_bias for p in params):
        return None, None
    width = max(len(p.logit_bias or {}) for p in params)
    rows = [list((p.logit_bias or {}).items()) for p in params]
    rows = [r + [(0, 0.0)] * (width - len(r)) for r in rows]
    ids = list_to_device([[t for t, _ in r] for r in rows], torch.int64, device)
    values = list_to_device([[b for _, b in r] for r in rows], torch.float32, device)
    return ids, values


def allowed_token_ids(
    params: list[SamplingParams], device: torch.device, forced: list[int | None] | None = None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """[N, max_num_allowed] ids padded with -1 and [N] bool (the rows with a list) of the rows'
    allowed_token_ids, or their one forced token (forced: per row, or None); (None, None) when
    no row has either."""
    lists = [p.allowed_token_ids for p in params]
    if forced is not None:
        lists = [a if f is None else [f] for a, f in zip(lists, forced, strict=True)]
    if not any(lists):
        return None, None
    ids = padded([a or [] for a in lists], device)
    rows = list_to_device([a is not None for a in lists], torch.bool, device)
    return ids, rows


def forced_token_ids(
    states: list[RequestState], drafted: list[list[int]] | None
) -> list[int | None] | None:
    """Per row, the token its thinking budget forces (None: free), or None when none is."""
    forced: list[int | None] = []
    for row, s in enumerate(states):
        token_id = None
        if s.thinking is not None:
            s.thinking.read(s.output_token_ids)
            token_id = s.thinking.forced_after(drafted[row] if drafted is not None else [])
        forced.append(token_id)
    return forced if any(t is not None for t in forced) else None


def padded(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Ragged id lists -> [N, max_len] int64 padded with -1."""
    width = max((len(r) for r in rows), default=0)
    return list_to_device([r + [-1] * (width - len(r)) for r in rows], torch.int64, device)
