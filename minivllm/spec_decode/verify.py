"""Verification of draft tokens on the device (torch, batched): exact acceptance against the
target's own keyed draws, Leviathan/Chen rejection sampling, and vLLM's synthetic acceptance
(forced rates, for benchmarks). No host sync inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.layers.dispatch import use_triton_kernels
from minivllm.layers.sampler import DRAW_SHIFT


@dataclass
class VerifyOutput:
    """num_accepted: [N] int64, the accepted draft tokens of each row (0..k_i).
    output_token_ids: [N, K + 1] int64: row i's first num_accepted[i] + 1 entries are its new
    tokens (the accepted drafts, then the target's token at the first mismatch or the bonus
    token), the rest -1."""

    num_accepted: torch.Tensor
    output_token_ids: torch.Tensor


def first_rows(num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """[N] int64: the first of request i's k_i + 1 rows among the T = sum(k_i + 1) target rows,
    which hold each request's positions in order, the last one the bonus position."""
    n = num_draft_tokens.to(torch.int64) + 1
    return torch.cumsum(n, 0) - n


def position_rows(num_draft_tokens: torch.Tensor, max_num_draft: int) -> torch.Tensor:
    """[N, K + 1] int64: the logits row of request i's position j (K = max_num_draft);
    entries with j > k_i point past the request (callers mask them)."""
    first = first_rows(num_draft_tokens)
    return first[:, None] + torch.arange(max_num_draft + 1, device=first.device)


def position_keys(
    seeds: torch.Tensor, first_draws: torch.Tensor, num_draft_tokens: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys of the target's draws at every position: (seeds [T], offsets [T]) int64.

    Position j of request i is its draw first_draws[i] + j: a seeded request passes its
    num_sampled (so position j gets the key its (num_sampled + j)-th token gets without
    speculation); unseeded rows share a step seed and pass distinct first_draws (e.g. their
    first row index), so no two positions share a counter range. total = T, known on the host,
    keeps repeat_interleave free of a sync.
    """
    n = num_draft_tokens.to(torch.int64) + 1
    row_seeds = torch.repeat_interleave(seeds, n, output_size=total)
    # Row t of request i is its position j = t - first_rows[i]: its draw first_draws[i] + j.
    base = first_draws.to(torch.int64) - first_rows(num_draft_tokens)
    draws = torch.repeat_interleave(base, n, output_size=total) + torch.arange(
        total, device=n.device
    )
    return row_seeds, draws << DRAW_SHIFT


def verify_exact(
    target_token_ids: torch.Tensor, draft_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor
) -> VerifyOutput:
    """Accepts draft j iff it equals the target's own token at position j (and all before it).

    target_token_ids: [T] int64, the token the sampler picks at each of the T = sum(k_i + 1)
    positions (greedy: argmax; random: its draw under position_keys); draft_token_ids: [N, K]
    int64 padded with -1; num_draft_tokens: [N] (k_i <= K). With the sampler's own draws the
    output equals what non-speculative decoding samples, token for token.
    """
    if use_triton_kernels(draft_token_ids.device):  # one launch instead of ~15 small ones
        from minivllm.kernels.verify import verify_exact_fused

        return VerifyOutput(
            *verify_exact_fused(
                target_token_ids,
                draft_token_ids.contiguous(),
                num_draft_tokens,
                first_rows(num_draft_tokens),
            )
        )
    k = draft_token_ids.shape[1]
    target = _position_targets(target_token_ids, num_draft_tokens, k)
    match = draft_token_ids == target[:, :k]
    return _keep_leading(draft_token_ids, num_draft_tokens, target, match)


def synthetic_conditional_rates(rates: Sequence[float]) -> list[float]:
    """Unconditional rates p (entry i: the probability that drafts 0..i are all accepted,
    non-increasing) -> the conditional c_i = p_i / p_{i-1} (p_{-1} = 1) that draft i is
    accepted given that all before it were; 0 after a p of 0."""
    out, previous = [], 1.0
    for p in rates:
        out.append(p / previous if previous > 0 else 0.0)
        previous = p
    return out


def verify_synthetic(
    target_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    conditional_rates: torch.Tensor,
    generator: torch.Generator | None = None,
    draft_allowed: torch.Tensor | None = None,
) -> VerifyOutput:
    """vLLM's synthetic acceptance (benchmarks): draft j is kept with probability
    conditional_rates[j] given that all before it were, whatever the target says, so the
    output is not the target's; the extra token is the target's own at the first rejected
    position, or the bonus position's.

    target_token_ids: [T] int64 and draft_token_ids / num_draft_tokens as for verify_exact.
    conditional_rates: [R] float32 on the device (synthetic_conditional_rates of the
    unconditional ones); positions j >= R are never accepted. generator: the source of the
    uniforms (on the drafts' device).
    draft_allowed: [N, K] bool or None; a draft where it is False is rejected (one the
    target cannot sample at all, e.g. a grammar's mask bans it).
    """
    num_rows, k = draft_token_ids.shape
    target = _position_targets(target_token_ids, num_draft_tokens, k)
    rates = conditional_rates[:k]
    if rates.shape[0] < k:
        rates = torch.cat([rates, rates.new_zeros(k - rates.shape[0])])
    uniforms = torch.rand(num_rows, k, generator=generator, device=draft_token_ids.device)
    accept = uniforms < rates
    if draft_allowed is not None:
        accept &= draft_allowed
    return _keep_leading(draft_token_ids, num_draft_tokens, target, accept)


def _position_targets(
    target_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor, k: int
) -> torch.Tensor:
    """[N, K + 1]: the target's token at each request's positions (past k_i: clamped rows,
    which callers mask)."""
    rows = position_rows(num_draft_tokens, k).clamp_(max=target_token_ids.shape[0] - 1)
    return target_token_ids[rows]


def _keep_leading(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    target: torch.Tensor,
    accept: torch.Tensor,
) -> VerifyOutput:
    """Keeps each request's leading drafts where accept [N, K] holds (within its k_i), then
    the target's token at the first position not kept."""
    k = draft_token_ids.shape[1]
    accept = accept & (torch.arange(k, device=accept.device) < num_draft_tokens[:, None])
    num_accepted = _leading_true(accept)
    final = target.gather(1, num_accepted[:, None]).squeeze(1)
    return VerifyOutput(num_accepted, _assemble(draft_token_ids, num_accepted, final))


def verify_rejection(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    is_greedy: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> VerifyOutput:
    """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): the output tokens are
    distributed as the target's p at every position, whatever the drafts.

    target_probs: [T, V] float32, p at each position after temperature / top-k / top-p / min-p
    (the sampler's processed distribution). draft_probs: [N, K, V], the q each draft was drawn
    from; None means q is one-hot at the draft token (ngram): draft x is then kept with
    probability p(x), and a rejection draws from p with x removed. Draft j is kept with
    probability min(1, p(x) / q(x)); at the first rejection the token is drawn from
    norm(max(0, p - q)); when all are kept the bonus token is drawn from p at the last position.
    is_greedy: [N] bool, rows that take the argmax of p instead (exact acceptance); None: no
    greedy rows. generator: the source of the uniforms and of the final draws.
    """
    num_rows, k = draft_token_ids.shape
    rows = position_rows(num_draft_tokens, k).clamp_(max=target_probs.shape[0] - 1)
    drafts = draft_token_ids.clamp(min=0)
    uniforms = torch.rand(num_rows, k, generator=generator, device=target_probs.device)
    accept = torch.empty(num_rows, k, dtype=torch.bool, device=target_probs.device)
    for j in range(k):
        p_x = target_probs[rows[:, j], drafts[:, j]]  # [N]
        q_x = 1.0 if draft_probs is None else draft_probs[:, j].gather(1, drafts[:, j, None])[:, 0]
        # u < p / q without dividing (q may round to 0).
        accept[:, j] = uniforms[:, j] * q_x < p_x
    accept &= torch.arange(k, device=rows.device) < num_draft_tokens[:, None]
    num_accepted = _leading_true(accept)
    final_rows = rows.gather(1, num_accepted[:, None])[:, 0]
    weights = _final_distribution(
        target_probs[final_rows], drafts, num_accepted, num_draft_tokens, draft_probs
    )
    final = _draw(weights, generator)
    out = VerifyOutput(num_accepted, _assemble(draft_token_ids, num_accepted, final))
    if is_greedy is None:
        return out
    exact = verify_exact(target_probs.argmax(dim=-1), draft_token_ids, num_draft_tokens)
    return VerifyOutput(
        torch.where(is_greedy, exact.num_accepted, out.num_accepted),
        torch.where(is_greedy[:, None], exact.output_token_ids, out.output_token_ids),
    )


def _final_distribution(
    p: torch.Tensor,
    drafts: torch.Tensor,
    num_accepted: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
) -> torch.Tensor:
    """[N, V] unnormalized: max(0, p - q) at a rejected position, p at the bonus position."""
    # p: [N, V], the target's p at each row's final position.
    num_rows, k = drafts.shape
    if k == 0:
        return p
    j = num_accepted.clamp(max=k - 1)
    if draft_probs is None:
        q = torch.zeros_like(p).scatter_(1, drafts.gather(1, j[:, None]), 1.0)
    else:
        q = draft_probs[torch.arange(num_rows, device=p.device), j]
    residual = (p - q).clamp_(min=0.0)
    rejected = num_accepted < num_draft_tokens
    # A residual of zero mass (p == q up to rounding) never follows a true rejection: draw p.
    usable = residual.sum(dim=-1) > 0
    return torch.where((rejected & usable)[:, None], residual, p)


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of nonnegative weights [N, V] (unnormalized): argmax(w / Exp(1))."""
    noise = torch.empty_like(weights).exponential_(generator=generator)
    return (weights / noise).argmax(dim=-1)


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """[N, K] bool -> [N] int64: the length of each row's all-True prefix."""
    return mask.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _assemble(
    draft_token_ids: torch.Tensor, num_accepted: torch.Tensor, final: torch.Tensor
) -> torch.Tensor:
    """[N, K + 1]: the accepted drafts, then `final` at column num_accepted, then -1."""
    num_rows, k = draft_token_ids.shape
    cols = torch.arange(k, device=draft_token_ids.device)
    out = torch.full((num_rows, k + 1), -1, dtype=torch.int64, device=draft_token_ids.device)
    out[:, :k] = torch.where(cols < num_accepted[:, None], draft_token_ids, -1)
    return out.scatter_(1, num_accepted[:, None], final.to(torch.int64)[:, None])
