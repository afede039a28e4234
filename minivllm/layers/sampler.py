"""The batched sampler: penalties, temperature, top-k / top-p / min-p and logprobs on the device.

One call per step over all rows (greedy and random together); no host sync inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from minivllm.layers.penalties import penalize, token_mask
from minivllm.layers.sampling_filters import keep_thresholds

if TYPE_CHECKING:
    from minivllm.kernels.penalties import RowPenalties  # Triton: imported where it runs

# A keyed draw d of a row uses philox counters [d << DRAW_SHIFT, (d << DRAW_SHIFT) + vocab_size):
# a stride of 2**32 > any vocab size keeps draws disjoint without knowing the vocab size.
DRAW_SHIFT = 32


@dataclass
class SamplingMetadata:
    """Per-row sampling parameters of one step, on the logits' device (N rows).

    Token-id tensors are padded with -1 (ids >= vocab size are ignored as well), so they do not
    depend on the vocab size.
    """

    temperature: torch.Tensor  # [N] float32, 0 = greedy
    top_p: torch.Tensor  # [N] float32, 1 = off
    top_k: torch.Tensor  # [N] int64, 0 = off
    min_p: torch.Tensor  # [N] float32, 0 = off
    presence_penalties: torch.Tensor  # [N] float32, 0 = off
    frequency_penalties: torch.Tensor  # [N] float32, 0 = off
    repetition_penalties: torch.Tensor  # [N] float32, 1 = off
    # [N, max_num_suppressed] int64: EOS / stop tokens banned until min_tokens; None when none.
    suppressed_token_ids: torch.Tensor | None
    # row -> the request's seeded generator; rows not in here use the default RNG.
    generators: dict[int, torch.Generator]
    all_greedy: bool
    all_random: bool
    # The no_* flags look at the rows they matter for (random rows for top-k/top-p/min-p).
    no_penalties: bool
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool
    max_top_k: int  # the largest top_k among random rows (0 when no_top_k)
    # Every random row's top-k within TOP_K_CAP, and set where its top-p is: the filters run
    # over torch.topk candidates, without a vocabulary sort (layers/sampling_filters.py).
    filter_by_candidates: bool = True
    max_num_logprobs: int | None = None
    # The rows whose logprobs are computed ([R] int64), where not every row asked; None: all.
    # SamplerOutput's logprob tensors hold those rows alone, in order.
    logprob_rows: torch.Tensor | None = None
    # Penalties (when not no_penalties): the penalized rows [P] int64 and their requests'
    # slots [P] int64 of the tables output_counts [S, W] int32 and prompt_mask [S, W] bool
    # (engine/runner/sampling/penalty_state.py); in a drafted step each row's drafts before it
    # [P, K] int64 (padded with -1), counted as output. penalty_req_ids: the rows' requests,
    # whose sampled tokens the runner records in the tables (None in a drafted step).
    penalty_rows: torch.Tensor | None = None
    penalty_slots: torch.Tensor | None = None
    penalty_req_ids: list[str] | None = None
    penalty_drafts: torch.Tensor | None = None
    output_counts: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    # [N] int64: each row's slot of the tables, -1 where the row is not penalized; set in a
    # step without drafts on the Triton path, whose filters and draw penalize as they read.
    penalty_row_slots: torch.Tensor | None = None
    # logit_bias: [N, max_num_biased] int64 ids and float32 values added to their logits (padded
    # with id 0 and value 0.0); None when no row has one.
    logit_bias_ids: torch.Tensor | None = None
    logit_bias_values: torch.Tensor | None = None
    # allowed_token_ids: [N, max_num_allowed] int64 ids padded with -1, and [N] bool the rows
    # that have a list (a row without one may sample any token)
    allowed_token_ids: torch.Tensor | None = None
    allowed_rows: torch.Tensor | None = None
    # Plain: every row greedy or temperature-only (no filters, penalties, suppression or
    # logprobs): a Triton sampler samples it in one fused pass (kernels/sampling.py).
    is_plain: bool = False
    # [N] int64 keys of the Triton draw: row i's noise is philox(seeds[i], offsets[i] + token
    # id). Set for every batch with random rows when the sampler uses Triton, for every plain
    # batch, and (zeros) for an all-greedy one whose penalties the Triton draw reads; None
    # otherwise.
    seeds: torch.Tensor | None = None
    offsets: torch.Tensor | None = None


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [N] int64
    # Set when max_num_logprobs is not None (k = max_num_logprobs), from the raw logits, for
    # the R rows that asked: logprob_rows [R] int64 (ascending), or None where every row did.
    logprob_token_ids: torch.Tensor | None = None  # [R, k + 1] int64: sampled token, then top k
    logprobs: torch.Tensor | None = None  # [R, k + 1] float32
    ranks: torch.Tensor | None = None  # [R] int64, rank of the sampled token (1 = most likely)
    logprob_rows: torch.Tensor | None = None


class Sampler(nn.Module):
    """Samples one token per row of `logits` under per-row parameters (vLLM semantics).

    use_triton: a plain batch takes one fused pass (kernels/sampling.py) instead of ~6 full
    [N, V] passes, every other batch with random rows draws with the same keyed noise
    (draw_kept), so that a seeded request's tokens do not depend on its neighbours. Where
    penalties are a step's only edit, the filter and draw kernels penalize each logit as they
    read it (penalties_on_read); else penalties run as one kernel over the penalized rows of a
    float32 copy (kernels/penalties.py).

    Workspace: one float32 copy of the logits (two with logprobs: their log_softmax, but where
    the Triton logprobs read the raw logits, kernels/logprobs.py's few KiB a row), [N, V]
    masks of one byte, and the filters' candidates (layers/sampling_filters.py, or
    kernels/filter_thresholds.py's few KiB a row); the filters' thresholds drop tokens inside
    the Triton draw, without a mask.
    """

    def __init__(self, use_triton: bool = False) -> None:
        super().__init__()
        self.use_triton = use_triton
        self._penalize = penalize
        # The largest top-k the Triton thresholds take (0: the torch path's torch.topk always).
        self.kernel_top_k_cap = 0
        # The most top logprobs the Triton logprobs take (more: log_softmax and torch.topk).
        self.kernel_logprobs_cap = 0
        if use_triton:
            from minivllm.kernels import filter_thresholds, logprobs
            from minivllm.kernels.penalties import RowPenalties, apply_penalties_from_tables
            from minivllm.kernels.sampling import sample_plain

            self._sample_plain = sample_plain
            self._token_logprobs = logprobs.token_logprobs
            self.kernel_logprobs_cap = logprobs.MAX_TOP_K
            self._row_penalties = RowPenalties
            self._penalize = apply_penalties_from_tables
            self._kernel_thresholds = filter_thresholds.filter_thresholds
            self._candidate_widths = filter_thresholds.CANDIDATE_WIDTHS
            self.kernel_top_k_cap = filter_thresholds.MAX_TOP_K

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        # logits: [N, V], any float dtype; left untouched.
        if meta.is_plain and self.use_triton:
            return SamplerOutput(
                self._sample_plain(logits, meta.temperature, meta.seeds, meta.offsets)
            )
        raw_logits, raw_logprobs = logits, None
        if meta.max_num_logprobs is not None and not self.use_triton:
            # Before the torch draw, which edits the logits in place.
            raw_logprobs = log_softmax_rows(logits, meta.logprob_rows)
        on_read = self.penalties_on_read(meta)
        if on_read is None:
            logits = self.edited(logits, meta)
        if meta.all_greedy and on_read is None:
            sampled = logits.argmax(dim=-1)
        elif meta.all_greedy:  # the draw kernel's argmax of the logits penalized as it reads
            sampled = self.draw_kept(logits, meta, on_read=on_read)
        else:
            # The torch draw leaves greedy rows to an argmax before the filters (the Triton
            # draw takes it itself).
            greedy_ids = None
            if not (meta.all_random or self.use_triton):
                greedy_ids = logits.argmax(dim=-1)
            # Each row keeps the logits at or above its threshold: greedy rows keep their
            # argmax.
            thresholds = None
            if _filters(meta):
                thresholds = self.thresholds(logits, meta, on_read)
            if self.use_triton:
                # Drawn from the unscaled logits with the fused kernel's keyed noise (the
                # same draw a plain batch makes for a row without filters), the dropped
                # tokens left out in the same pass.
                sampled = self.draw_kept(logits, meta, thresholds, on_read)
            else:
                if thresholds is not None:
                    logits.masked_fill_(logits < thresholds, -torch.inf)
                sampled = self._sample(logits, meta)
                if greedy_ids is not None:
                    sampled = torch.where(meta.temperature == 0.0, greedy_ids, sampled)
        out = SamplerOutput(sampled_token_ids=sampled)
        if meta.max_num_logprobs is not None:
            # The Triton path leaves the raw logits as they are: read after the draw.
            rows, k = meta.logprob_rows, meta.max_num_logprobs
            if self.use_triton and k <= self.kernel_logprobs_cap:
                logprobs = self._token_logprobs(raw_logits, sampled, k, rows)
            else:
                if raw_logprobs is None:
                    raw_logprobs = log_softmax_rows(raw_logits, rows)
                asked = sampled if rows is None else sampled.index_select(0, rows)
                logprobs = gather_logprobs(raw_logprobs, asked, k)
            out.logprob_token_ids, out.logprobs, out.ranks = logprobs
            out.logprob_rows = rows
        return out

    def penalties_on_read(self, meta: SamplingMetadata) -> RowPenalties | None:
        """The step's penalties for the Triton filters and draw to apply as they read the
        logits (no float32 copy, no penalty pass), where they are its only edit, it has the
        draw's keys (an all-greedy step's are zeros: the draw takes its argmax) and its
        thresholds come from the Triton kernels; else None."""
        if (
            not self.use_triton
            or meta.penalty_row_slots is None
            or meta.seeds is None
            or meta.suppressed_token_ids is not None
            or meta.logit_bias_ids is not None
            or meta.allowed_token_ids is not None
            or (_filters(meta) and not self._kernel_thresholds_apply(meta))
        ):
            return None
        return self._row_penalties(
            meta.penalty_row_slots,
            meta.output_counts,
            meta.prompt_mask,
            meta.repetition_penalties,
            meta.frequency_penalties,
            meta.presence_penalties,
        )

    def edited(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """logits with the rows' edits applied: logit bias, banned tokens (min_tokens, bad
        words), allowed tokens, penalties. One float32 copy where any row is edited (or the
        torch draw, which scales and masks in place, follows); else logits themselves (the
        Triton kernels read any dtype)."""
        needs_edit = (
            meta.suppressed_token_ids is not None
            or meta.logit_bias_ids is not None
            or meta.allowed_token_ids is not None
            or not meta.no_penalties
            or not (meta.all_greedy or self.use_triton)
        )
        logits = logits.to(torch.float32, copy=needs_edit)
        if meta.logit_bias_ids is not None:
            logits.scatter_add_(1, meta.logit_bias_ids, meta.logit_bias_values)
        if meta.suppressed_token_ids is not None:
            ban_tokens(logits, meta.suppressed_token_ids)
        if meta.allowed_token_ids is not None:
            logits.masked_fill_(disallowed_mask(meta, logits.shape[1]), -torch.inf)
        if not meta.no_penalties:
            logits = self._penalize(logits, *_penalty_args(meta))
        return logits

    def compile_kernels(self, logits: torch.Tensor) -> None:
        """Compiles the Triton variants a step's filtered draw can take, now (engine start):
        thresholds and draw over logits in their own dtype (no row edited) and in float32,
        at each candidate width, and the draw's variants with penalties read as it reads the
        model's logits (penalties_on_read), filtered or not, and the logprobs' passes.
        logits: [1, V] as the model computes them."""
        if not self.use_triton:
            return
        device = logits.device
        ones = torch.ones(1, device=device)
        keys = torch.zeros(1, dtype=torch.int64, device=device)
        for x in (logits, logits.float()):
            for width in self._candidate_widths:
                top_k = torch.full((1,), width, dtype=torch.int64, device=device)
                thresholds = self._kernel_thresholds(x, ones, top_k, ones, ones * 0, width)
                self._sample_plain(x, ones, keys, keys, thresholds=thresholds)
        counts = torch.zeros(1, 1, dtype=torch.int32, device=device)
        penalties = self._row_penalties(keys, counts, counts.bool(), ones, ones * 0, ones * 0)
        for thresholds in (ones.view(1, 1), None):
            self._sample_plain(logits, ones, keys, keys, thresholds=thresholds,
                               penalties=penalties)  # fmt: skip
        for rows in (None, keys):  # the logprobs of every row, of some
            self._token_logprobs(logits, keys, 1, rows)

    def thresholds(
        self, logits: torch.Tensor, meta: SamplingMetadata, on_read: RowPenalties | None = None
    ) -> torch.Tensor:
        """[N, 1]: the smallest logit each row keeps under its top-k, top-p and min-p; the
        Triton kernels' two passes where every filtering row's top-k is within their cap
        (penalizing as they read, with on_read), else torch.topk candidates or the sort
        (layers/sampling_filters.py)."""
        if self._kernel_thresholds_apply(meta):
            return self._kernel_thresholds(logits, *_filter_args(meta), penalties=on_read)
        assert on_read is None, "penalties on read need the Triton thresholds"
        return filter_thresholds(logits, meta)

    def _kernel_thresholds_apply(self, meta: SamplingMetadata) -> bool:
        return (
            self.use_triton
            and meta.filter_by_candidates
            and meta.max_top_k <= self.kernel_top_k_cap
        )

    def draw_kept(
        self,
        logits: torch.Tensor,
        meta: SamplingMetadata,
        thresholds: torch.Tensor | None = None,
        on_read: RowPenalties | None = None,
    ) -> torch.Tensor:
        """Gumbel-max draw (the Triton sampler's keyed noise) from logits [N, V] (penalized,
        or penalized as read with on_read; unscaled, dropped tokens -inf or below thresholds
        [N, 1]); greedy rows take the argmax of what they keep."""
        return self._sample_plain(
            logits, meta.temperature, meta.seeds, meta.offsets, thresholds=thresholds,
            penalties=on_read,
        )  # fmt: skip

    @staticmethod
    def _sample(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        # Greedy rows get temperature 1 here only to avoid dividing by 0; their result is unused.
        temperature = torch.where(meta.temperature == 0.0, 1.0, meta.temperature)
        probs = logits.div_(temperature.unsqueeze(1)).softmax(dim=-1)
        return exponential_race(probs, meta.generators)


def _filters(meta: SamplingMetadata) -> bool:
    """Whether a random row of the step has top-k, top-p or min-p."""
    return not (meta.no_top_k and meta.no_top_p and meta.no_min_p)


def log_softmax_rows(logits: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """[R, V] float32 log_softmax of logits' rows [R] (all where rows is None): the torch
    path's logprobs, before gather_logprobs."""
    asked = logits if rows is None else logits.index_select(0, rows)
    return torch.log_softmax(asked, dim=-1, dtype=torch.float32)


def filter_thresholds(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """[N, 1]: the smallest logit each row keeps under its top-k, top-p and min-p."""
    return keep_thresholds(logits, *_filter_args(meta), meta.filter_by_candidates)


def _filter_args(meta: SamplingMetadata) -> tuple:
    """The threshold functions' arguments after the logits: temperature, top_k, top_p and
    min_p (None where no row uses it), max_top_k."""
    return (
        meta.temperature,
        None if meta.no_top_k else meta.top_k,
        None if meta.no_top_p else meta.top_p,
        None if meta.no_min_p else meta.min_p,
        meta.max_top_k,
    )


def _penalty_args(meta: SamplingMetadata) -> tuple:
    """The penalty functions' arguments after the logits, from meta."""
    return (
        meta.penalty_rows,
        meta.penalty_slots,
        meta.output_counts,
        meta.prompt_mask,
        meta.repetition_penalties,
        meta.frequency_penalties,
        meta.presence_penalties,
        meta.penalty_drafts,
    )


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Repetition (prompt + output), then frequency and presence (output) penalties, in place
    (the torch definition; layers/penalties.py)."""
    return penalize(logits, *_penalty_args(meta))


def ban_tokens(logits: torch.Tensor, token_ids: torch.Tensor) -> None:
    """Sets logits [N, V] float32 to -inf at each row's token_ids [N, M] int64 (padded with
    -1; ids outside the vocabulary ignored), in place: one scatter of N x M elements."""
    valid = (token_ids >= 0) & (token_ids < logits.shape[1])
    # amin with +inf leaves the padding's target as it is, whichever id it points at.
    values = torch.where(valid, -torch.inf, torch.inf)
    logits.scatter_reduce_(1, torch.where(valid, token_ids, 0), values, reduce="amin")


def disallowed_mask(meta: SamplingMetadata, vocab_size: int) -> torch.Tensor:
    """[N, vocab_size] bool, True for the tokens a row with allowed_token_ids may not sample."""
    assert meta.allowed_token_ids is not None and meta.allowed_rows is not None
    return ~token_mask(meta.allowed_token_ids, vocab_size) & meta.allowed_rows.unsqueeze(1)


def exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """argmax(probs / q), q ~ Exp(1): a draw from each row of probs without a host sync.

    A seeded row draws its own q from its generator, so its tokens do not depend on the batch.
    """
    # probs: [N, V] float32
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_()
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    return probs.div_(q).argmax(dim=-1)


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_logprobs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logprob and rank of token_ids, plus the top num_logprobs of each row.

    logprobs: [N, V] float32 (a log_softmax); token_ids: [N] int64. Returns ids [N, k + 1]
    (the given token first), their logprobs [N, k + 1] and the given token's rank [N]
    (1 + the number of strictly more likely tokens).
    """
    k = min(num_logprobs, logprobs.shape[1])
    token_ids = token_ids.unsqueeze(1)  # [N, 1]
    token_logprobs = logprobs.gather(1, token_ids)  # [N, 1]
    ranks = (logprobs > token_logprobs).sum(dim=-1) + 1
    top_logprobs, top_ids = logprobs.topk(k, dim=-1)
    ids = torch.cat([token_ids, top_ids], dim=1)
    values = torch.cat([token_logprobs, top_logprobs], dim=1)
    return ids, values, ranks
