"""A verify step's decode rows in a Gated DeltaNet layer (speculative decoding on hybrid
models). A decode chunk with d drafts is 1 + d rows of one request; they run position by
position through the one-token step (conv update, then the rule's step: the arithmetic, and so
the bits, of decoding them one a step), each row reading the state where the row before it
left it and writing the state after it to the slot of its position: a draft-state slot after each of
the first d rows, the request's own slot after the last. Once the step's drafts are verified,
the scheduler copies the state after the last accepted position into the request's slot
(engine/sched/kv/draft_states.py): a rejected draft never reaches it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VerifyRows:
    """The step's decode rows by draft position: those of position p are rows[offsets[p] :
    offsets[p + 1]] (offsets on the host), each reading its states at src_slots and writing
    them at dst_slots (both [num_decode_rows] int32; a chunk without drafts is one row of
    position 0, read and written in place)."""

    offsets: tuple[int, ...]
    rows: torch.Tensor  # [num_decode_rows] int64
    src_slots: torch.Tensor
    dst_slots: torch.Tensor

    def positions(self):
        """(rows, src_slots, dst_slots) of each position in turn."""
        for start, end in zip(self.offsets[:-1], self.offsets[1:], strict=True):
            yield self.rows[start:end], self.src_slots[start:end], self.dst_slots[start:end]


def conv_verify(
    conv_update: Callable, x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
    verify: VerifyRows,
) -> torch.Tensor:  # fmt: skip
    """The causal conv (silu) of the decode rows x [num_decode_rows, C] -> [num_decode_rows,
    C]; conv_update is the one-token update (torch or Triton), taking dst_slots."""
    out = torch.empty_like(x)
    for rows, src, dst in verify.positions():
        conv_update(x, weight, None, conv_state, src, "silu", dst, rows=rows, out=out)
    return out


def rule_verify(
    rule_decode: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
    beta: torch.Tensor, ssm_state: torch.Tensor, verify: VerifyRows,
) -> torch.Tensor:  # fmt: skip
    """The gated delta rule over the decode rows (q, k [R, H_k, d_k], v [R, H_v, d_v], g, beta
    [R, H_v]) -> [R, H_v, d_v]; rule_decode is the one-token step (torch or Triton)."""
    out = torch.empty_like(v)
    for rows, src, dst in verify.positions():
        rule_decode(
            q, k, v, g, beta, ssm_state, src, use_qk_l2norm=True, dst_slots=dst, rows=rows,
            out=out,
        )  # fmt: skip
    return out
