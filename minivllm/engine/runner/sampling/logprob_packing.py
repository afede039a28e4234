"""A step's logprobs across the copy to the host: the sampler's tensors packed into one float64
tensor on the device (one copy a step), and its rows read back as plain LogprobsDicts.
Sampled tokens' logprobs (pack_logprobs, to_runner_logprobs) and prompt logprobs
(pack_prompt_logprobs, prompt_logprob_dicts) share the packing."""

from __future__ import annotations

import torch

from minivllm.layers.sampler import SamplerOutput, gather_logprobs
from minivllm.outputs import Logprob, LogprobsDict


def pack_logprobs(sampler_out: SamplerOutput) -> torch.Tensor:
    """A step's logprobs as one float64 tensor [R, 2(k+1)+1] on the device (ids, logprobs,
    rank a row; one row for each row that asked), so that one copy brings them to the host:
    float64 holds int ids (< 2**53) and float32 logprobs exactly."""
    assert sampler_out.logprobs is not None, "the step was built without logprobs"
    return _pack(sampler_out.logprob_token_ids, sampler_out.logprobs, sampler_out.ranks)


def to_runner_logprobs(
    packed_rows: list[list[float]], num_logprobs: list[int | None]
) -> list[LogprobsDict | None]:
    """Per row: {token_id: Logprob} (sampled token + top num_logprobs[row]), or None.

    packed_rows: pack_logprobs' rows on the host, one for each row that asked (num_logprobs
    not None), in order. num_logprobs is taken when the step is launched: the requests may
    have ended (and left the sampling state) by the time the step's results are read.
    """
    width = _width(packed_rows)
    asked = iter(packed_rows)
    result: list[LogprobsDict | None] = [
        None if k is None else _to_dict(next(asked), width, k) for k in num_logprobs
    ]
    if next(asked, None) is not None:
        raise ValueError("more packed logprob rows than rows that asked for logprobs")
    return result


def pack_prompt_logprobs(
    logits: torch.Tensor, next_token_ids: torch.Tensor, num_logprobs: int
) -> torch.Tensor:
    """Prompt logprobs, packed as pack_logprobs packs a step's: row i scores next_token_ids[i]
    (prompt token i + 1) from logits[i] [P, V] (raw), with the top num_logprobs tokens."""
    logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # [P, V]
    return _pack(*gather_logprobs(logprobs, next_token_ids, num_logprobs))


def prompt_logprob_dicts(packed_rows: list[list[float]], num_logprobs: int) -> list[LogprobsDict]:
    """pack_prompt_logprobs' rows on the host -> one LogprobsDict a row: the scored token
    (with its rank) plus the top num_logprobs tokens."""
    width = _width(packed_rows)
    return [_to_dict(row, width, num_logprobs) for row in packed_rows]


def _pack(token_ids: torch.Tensor, logprobs: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """[N, k+1] ids, [N, k+1] logprobs, [N] ranks -> [N, 2(k+1)+1] float64."""
    return torch.cat([token_ids.double(), logprobs.double(), ranks.double().unsqueeze(1)], 1)


def _width(rows: list[list[float]]) -> int:
    """k + 1 of _pack's rows: the ids (and the logprobs) each row holds."""
    return (len(rows[0]) - 1) // 2 if rows else 0


def _to_dict(row: list[float], width: int, num_logprobs: int) -> LogprobsDict:
    """One of _pack's rows (as a list: width ids, width logprobs, the rank) -> its dict. One
    pass, no intermediate lists: a step reads a few hundred of these on the host."""
    # The sampled/scored token first; if it is also in the top k, that entry (same logprob)
    # replaces it, as in vLLM.
    entry = {int(row[0]): Logprob(row[width], int(row[-1]), None)}
    for j in range(1, min(num_logprobs, width - 1) + 1):
        entry[int(row[j])] = Logprob(row[width + j], j, None)
    return entry
