"""Where the batch-invariant attention (kernels/batch_invariant_attention.py) cuts a row's keys
into segments: the rule, in Python for the launcher (grids, scratch) and as its twin for the
kernels. A function of the row's own position only, so it keeps the mode batch-invariant
(docs/determinism.md)."""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@dataclass(frozen=True)
class SegmentRule:
    """A row with ctx = q_pos + 1 visible keys cuts them into segments of
    `length(ctx)` = min_len * 2^k keys, the shortest (k >= 0) that makes at most per_row
    segments, capped at max_len; segments start at multiples of their length. Short contexts
    get short segments (split-KV programs for small decode batches), long ones long segments
    (fewer folds in the one-pass walk); past max_len * per_row keys a row gets more segments
    instead, so a long decode row still splits. The kernel's twin is `segment_len`; both must
    stay fixed for an engine's lifetime (they set a row's arithmetic)."""

    min_len: int = 128  # a multiple of every BLOCK_N of batch_invariant_configs
    per_row: int = 8
    max_len: int = 2048

    def __post_init__(self) -> None:
        for name, val in (("min_len", self.min_len), ("max_len", self.max_len)):
            if val < 16 or val & (val - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {val}")
        if self.max_len < self.min_len or self.per_row < 1:
            raise ValueError(f"need max_len >= min_len and per_row >= 1, got {self}")

    def length(self, ctx: int) -> int:
        doublings = min(-(-ctx // (self.min_len * self.per_row)), self.max_len // self.min_len)
        return self.min_len * triton.next_power_of_2(doublings)

    def max_count(self, max_ctx: int) -> int:
        """The most segments of a row with at most max_ctx keys: the split launch's grid."""
        return max(min(self.per_row, -(-max_ctx // self.min_len)), -(-max_ctx // self.max_len))


SEGMENTS = SegmentRule()


@triton.jit
def segment_len(ctx, MIN_LEN: tl.constexpr, PER_ROW: tl.constexpr, MAX_LEN: tl.constexpr):
    """SegmentRule.length for ctx >= 1 (a scalar or a tensor of int32)."""
    x = tl.minimum((ctx - 1) // (MIN_LEN * PER_ROW), MAX_LEN // MIN_LEN - 1)
    # x + 1 rounded up to a power of two: smear x's top bit into every lower bit, add one.
    x = x | (x >> 1)
    x = x | (x >> 2)
    x = x | (x >> 4)
    x = x | (x >> 8)
    x = x | (x >> 16)
    return MIN_LEN * (x + 1)
