"""The gated delta rule in torch, over packed sequences with a recurrent state slot per request:
the chunked form for prefill and the one-token step for decode. The CPU path, and the oracle
of the Triton kernels in `kernels/gated_delta/`.

Per value head, with a state S of [d_k, d_v] (float32) and one token's q, k [d_k], v [d_v],
decay g <= 0 (log space) and update gate beta in (0, 1):

    S <- exp(g) * S
    S <- S + k (beta * (v - S^T k))^T        # the delta rule: write only what S mispredicts
    o  = scale * S^T q
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (HF's and FLA's form), in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """[..., num_k_heads, d] -> [..., num_v_heads, d]: each q/k head serves
    num_v_heads // num_k_heads consecutive value heads."""
    return x.repeat_interleave(num_v_heads // x.shape[-2], dim=-2)


def chunk_gated_delta_rule_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, chunk by chunk. q (already scaled), k: [L, H, d_k]; v: [L, H, d_v];
    g, beta: [L, H]; initial_state: [H, d_k, d_v] or None (zeros).
    Returns (out [L, H, d_v] float32, final state [H, d_k, d_v] float32)."""
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))  # [H, L, d]
    g, beta = g.float().t(), beta.float().t()  # [H, L]
    num_heads, seq_len, d_k = k.shape
    if initial_state is None:
        state = torch.zeros(num_heads, d_k, v.shape[-1], device=v.device)
    else:
        state = initial_state.float().clone()
    out = torch.empty_like(v)
    for start in range(0, seq_len, chunk_size):
        sl = slice(start, min(start + chunk_size, seq_len))
        qc, kc, vc, bc = q[:, sl], k[:, sl], v[:, sl], beta[:, sl, None]
        gc = g[:, sl].cumsum(-1)  # [H, n]: log of the decay from the chunk start to row i
        n = gc.shape[-1]
        lower = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
        # decay[i, j] = exp(gc_i - gc_j) for j <= i: what token j's write has decayed by at i.
        decay = (gc[:, :, None] - gc[:, None, :]).masked_fill(~lower, float("-inf")).exp()
        # WY form: the chunk's n rank-one updates are (I + A)^-1 applied to beta*v and to
        # beta*k*exp(gc), A strictly lower (unitriangular solve ignores the diagonal).
        a = (bc * kc) @ kc.transpose(-1, -2) * decay
        rhs = torch.cat([bc * vc, bc * kc * gc.exp()[..., None]], -1)
        uw = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
        u, w = uw[..., : vc.shape[-1]], uw[..., vc.shape[-1] :]
        v_new = u - w @ state  # each row's write, less what the old state already predicts
        attn = (qc @ kc.transpose(-1, -2)) * decay
        out[:, sl] = (qc * gc.exp()[..., None]) @ state + attn @ v_new
        last = gc[:, -1:]  # [H, 1]
        k_decayed = kc * (last - gc).exp()[..., None]
        state = state * last.exp()[..., None] + k_decayed.transpose(-1, -2) @ v_new
    return out.transpose(0, 1), state


def _prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float | None, use_qk_l2norm: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return expand_heads(q * scale, num_v_heads), expand_heads(k, num_v_heads)


def gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> torch.Tensor:
    """Packed sequences. q, k: [T, H_k, d_k]; v: [T, H_v, d_v]; g, beta: [T, H_v];
    cu_seqlens: [N + 1]; state: [num_slots, H_v, d_k, d_v] float32, sequence i starts from
    state[state_slots[i]] where has_initial_state[i] (else zeros) and its final state is
    written there (an empty sequence leaves it alone). scale defaults to d_k ** -0.5.
    Returns out [T, H_v, d_v] in v.dtype."""
    num_v_heads = v.shape[1]
    q, k = _prepare_qk(q, k, num_v_heads, scale, use_qk_l2norm)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    bounds = cu_seqlens.tolist()
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if start == end:
            continue  # an empty sequence leaves its state alone
        slot = int(state_slots[i])
        init = state[slot] if bool(has_initial_state[i]) else None
        sl = slice(start, end)
        out[sl], final = chunk_gated_delta_rule_one(q[sl], k[sl], v[sl], g[sl], beta[sl], init)
        state[slot] = final
    return out.to(v.dtype)


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    dst_slots: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per request. q, k: [N, H_k, d_k]; v: [N, H_v, d_v]; g, beta: [N, H_v];
    state: [num_slots, H_v, d_k, d_v] float32, read at state_slots [N] and written at
    dst_slots [N] (None: in place, at state_slots; a verify step's rows write the state after
    each draft elsewhere); a slot < 0 is a padded row (its state untouched, its output
    zeros). With rows [R], request i's token is row rows[i] of the inputs and of the output
    (written into out where given, only at rows). Returns [N, H_v, d_v]."""
    if rows is not None:
        picked = gated_delta_rule_decode(
            q[rows], k[rows], v[rows], g[rows], beta[rows], state, state_slots, scale,
            use_qk_l2norm, dst_slots,
        )  # fmt: skip
        out = torch.empty_like(v) if out is None else out
        out[rows] = picked
        return out
    q, k = _prepare_qk(q, k, v.shape[1], scale, use_qk_l2norm)
    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    rows = (state_slots >= 0).nonzero().flatten()
    slots = state_slots[rows].long()
    dst = slots if dst_slots is None else dst_slots[rows].long()
    s = state[slots] * g[rows].float().exp()[..., None, None]  # [n, H, d_k, d_v]
    predicted = torch.einsum("nhkv,nhk->nhv", s, k[rows])
    delta = (v[rows].float() - predicted) * beta[rows].float()[..., None]
    s = s + k[rows][..., None] * delta[..., None, :]
    out[rows] = torch.einsum("nhkv,nhk->nhv", s, q[rows])
    state[dst] = s
    return out.to(v.dtype)


def gated_delta_gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3.5's gates from the a and b projections [T, H_v]: (g, beta) with
    g = -exp(A_log) * softplus(a + dt_bias), the log decay, in float32 (in float16, exp(A_log)
    could overflow) and beta = sigmoid(b) in b's dtype, as HF computes them."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()
