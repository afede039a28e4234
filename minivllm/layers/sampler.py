"""The batched sampler: penalties, temperature, top-k / top-p / min-p and logprobs on the device.

One call per step over all rows (greedy and random together); no host sync inside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# A keyed draw d of a row uses philox counters [d << DRAW_SHIFT, (d << DRAW_SHIFT) + vocab_size):
# a stride of 2**32 > any vocab size keeps draws disjoint without knowing the vocab size.
DRAW_SHIFT = 32


@dataclass
class SamplingMetadata:
    """Per-row sampling parameters of one step, on the logits' device (N rows).

    Token-id tensors are padded with -1 (ids >= vocab size are ignored as well), so they do not
    depend on the vocab size; the sampler turns them into [N, V] counts and masks.
    """

    temperature: torch.Tensor  # [N] float32, 0 = greedy
    top_p: torch.Tensor  # [N] float32, 1 = off
    top_k: torch.Tensor  # [N] int64, 0 = off
    min_p: torch.Tensor  # [N] float32, 0 = off
    presence_penalties: torch.Tensor  # [N] float32, 0 = off
    frequency_penalties: torch.Tensor  # [N] float32, 0 = off
    repetition_penalties: torch.Tensor  # [N] float32, 1 = off
    # [N, max_num_output_tokens] int64; None when no_penalties.
    output_token_ids: torch.Tensor | None
    # [N, max_prompt_len] int64; None unless some row has a repetition penalty.
    prompt_token_ids: torch.Tensor | None
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
    max_num_logprobs: int | None = None
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
    # id). Set for every batch with random rows when the sampler uses Triton, and for every
    # plain batch; None otherwise.
    seeds: torch.Tensor | None = None
    offsets: torch.Tensor | None = None


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [N] int64
    # Set when max_num_logprobs is not None (k = max_num_logprobs), from the raw logits.
    logprob_token_ids: torch.Tensor | None = None  # [N, k + 1] int64: sampled token, then top k
    logprobs: torch.Tensor | None = None  # [N, k + 1] float32
    ranks: torch.Tensor | None = None  # [N] int64, rank of the sampled token (1 = most likely)


class Sampler(nn.Module):
    """Samples one token per row of `logits` under per-row parameters (vLLM semantics).

    use_triton: a plain batch takes one fused pass (kernels/sampling.py) instead of ~6 full
    [N, V] passes, and every other batch with random rows draws with the same keyed noise
    (draw_filtered), so that a seeded request's tokens do not depend on its neighbours.
    """

    def __init__(self, use_triton: bool = False) -> None:
        super().__init__()
        self.use_triton = use_triton
        if use_triton:
            from minivllm.kernels.sampling import sample_plain

            self._sample_plain = sample_plain

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        # logits: [N, V], any float dtype; left untouched.
        if meta.is_plain and self.use_triton:
            return SamplerOutput(
                self._sample_plain(logits, meta.temperature, meta.seeds, meta.offsets)
            )
        raw_logprobs = None
        if meta.max_num_logprobs is not None:
            raw_logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        needs_edit = (
            meta.suppressed_token_ids is not None
            or meta.logit_bias_ids is not None
            or meta.allowed_token_ids is not None
            or not meta.no_penalties
            or not meta.all_greedy
        )
        # One float32 copy, then everything below works in place on it.
        logits = logits.to(torch.float32, copy=needs_edit)
        if meta.logit_bias_ids is not None:
            logits.scatter_add_(1, meta.logit_bias_ids, meta.logit_bias_values)
        if meta.suppressed_token_ids is not None:
            logits.masked_fill_(token_mask(meta.suppressed_token_ids, logits.shape[1]), -torch.inf)
        if meta.allowed_token_ids is not None:
            logits.masked_fill_(disallowed_mask(meta, logits.shape[1]), -torch.inf)
        if not meta.no_penalties:
            logits = apply_penalties(logits, meta)
        greedy_ids = None if meta.all_random else logits.argmax(dim=-1)
        if meta.all_greedy:
            sampled = greedy_ids
        elif self.use_triton:
            # Filter on a copy, then draw from the unscaled logits with the fused kernel's
            # keyed noise: the same draw a plain batch makes for a row without filters.
            filtered = self._filter(logits.clone(), meta)
            sampled = self.draw_filtered(logits, filtered, meta)
        else:
            sampled = self._sample(logits, meta)
            if greedy_ids is not None:
                sampled = torch.where(meta.temperature == 0.0, greedy_ids, sampled)
        out = SamplerOutput(sampled_token_ids=sampled)
        if raw_logprobs is not None:
            out.logprob_token_ids, out.logprobs, out.ranks = gather_logprobs(
                raw_logprobs, sampled, meta.max_num_logprobs
            )
        return out

    def draw_filtered(
        self, logits: torch.Tensor, filtered: torch.Tensor, meta: SamplingMetadata
    ) -> torch.Tensor:
        """Gumbel-max draw (the Triton sampler's keyed noise) from logits [N, V] (penalized,
        unscaled) with the tokens that filtered [N, V] dropped (-inf) masked out; greedy rows
        take the argmax."""
        kept = logits.masked_fill(filtered == -torch.inf, -torch.inf)
        return self._sample_plain(kept, meta.temperature, meta.seeds, meta.offsets)

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        probs = self._filter(logits, meta).softmax(dim=-1)
        return exponential_race(probs, meta.generators)

    @staticmethod
    def _filter(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Temperature, then top-k / top-p / min-p (dropped tokens -inf), in place."""
        # Greedy rows get temperature 1 here only to avoid dividing by 0; their result is unused.
        temperature = torch.where(meta.temperature == 0.0, 1.0, meta.temperature)
        logits.div_(temperature.unsqueeze(1))
        if not meta.no_top_p:
            logits = apply_top_k_top_p(logits, None if meta.no_top_k else meta.top_k, meta.top_p)
        elif not meta.no_top_k:
            logits = apply_top_k(logits, meta.top_k, meta.max_top_k)
        if not meta.no_min_p:
            logits = apply_min_p(logits, meta.min_p)
        return logits


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, L] int64 ids padded with -1 -> [N, vocab_size] int32 occurrence counts."""
    # Padding and out-of-vocab ids land in an extra dump column that is cut off.
    ids = torch.where((token_ids < 0) | (token_ids >= vocab_size), vocab_size, token_ids)
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
    return counts[:, :vocab_size]


def token_mask(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, L] int64 ids padded with -1 -> [N, vocab_size] bool, True where the id occurs."""
    return token_counts(token_ids, vocab_size) > 0


def disallowed_mask(meta: SamplingMetadata, vocab_size: int) -> torch.Tensor:
    """[N, vocab_size] bool, True for the tokens a row with allowed_token_ids may not sample."""
    assert meta.allowed_token_ids is not None and meta.allowed_rows is not None
    return ~token_mask(meta.allowed_token_ids, vocab_size) & meta.allowed_rows.unsqueeze(1)


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Repetition (prompt + output), then frequency and presence (output) penalties, in place."""
    # logits: [N, V] float32
    vocab_size = logits.shape[1]
    output_counts = token_counts(meta.output_token_ids, vocab_size)  # [N, V]
    output_mask = output_counts > 0
    if meta.prompt_token_ids is not None:
        seen = output_mask | token_mask(meta.prompt_token_ids, vocab_size)
        penalties = torch.where(seen, meta.repetition_penalties.unsqueeze(1), 1.0)
        logits = torch.where(logits > 0, logits / penalties, logits * penalties)
    logits -= meta.frequency_penalties.unsqueeze(1) * output_counts
    logits -= meta.presence_penalties.unsqueeze(1) * output_mask
    return logits


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Masks logits below each row's k-th largest (ties kept); top_k 0 = off. In place."""
    vocab_size = logits.shape[1]
    max_top_k = min(max(max_top_k, 1), vocab_size)
    # Only the max_top_k largest values are needed to find every row's k-th largest.
    top_values = logits.topk(max_top_k, dim=-1).values  # [N, max_top_k]
    k = top_k.clamp(1, max_top_k)
    kth = top_values.gather(1, (k - 1).unsqueeze(1))  # [N, 1]
    kth.masked_fill_((top_k == 0).unsqueeze(1), -torch.inf)
    return logits.masked_fill_(logits < kth, -torch.inf)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor
) -> torch.Tensor:
    """Top-k (when given), then top-p over the renormalized rest, via one sort. In place."""
    vocab_size = logits.shape[1]
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)  # [N, V]
    if top_k is not None:
        k = torch.where(top_k == 0, vocab_size, top_k).clamp(1, vocab_size)
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))  # [N, 1]
        sorted_logits.masked_fill_(sorted_logits < kth, -torch.inf)
    probs = sorted_logits.softmax(dim=-1)
    # A token stays while the more likely tokens before it hold < top_p of the mass: the kept
    # set is the smallest with mass >= top_p and always holds the top token. Rows with
    # top_p == 1 are left alone so that cumsum rounding cannot cut their tail.
    mass_before = probs.cumsum(dim=-1) - probs
    drop = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    # A top_p below float32's smallest value arrives as 0: the top token must still stay.
    drop[:, 0] = False
    sorted_logits.masked_fill_(drop, -torch.inf)
    return logits.scatter_(1, sorted_ids, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drops tokens with prob < min_p * max_prob; min_p 0 = off. In place."""
    max_logits = logits.amax(dim=-1, keepdim=True)  # [N, 1]
    # prob / max_prob == exp(logit - max_logit), so compare in log space (log 0 = -inf: keep all).
    threshold = max_logits + torch.log(min_p).unsqueeze(1)
    return logits.masked_fill_(logits < threshold, -torch.inf)


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
