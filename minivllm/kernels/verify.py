"""Exact verification of draft tokens in one launch: request i keeps its leading drafts that
equal the target's own token at their position, then the target's token at the first
mismatch (or at the bonus position after its last draft).

The T = sum(k_i + 1) target tokens hold each request's k_i + 1 positions in order; program i
reads its k_i drafts and k_i + 1 targets and writes its accepted count and its row of output
tokens. Semantics: spec_decode/verify.verify_exact, whose torch definition (about fifteen
small launches) stays the CPU path and the tests' reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor

# One compiled variant for steps of up to 31 drafts a request (the block covers K + 1).
MIN_BLOCK = 32


@triton.jit(
    do_not_specialize=["num_cols"],
    do_not_specialize_on_alignment=["target_ptr", "drafts_ptr", "num_drafts_ptr", "starts_ptr"],
)
def _verify_exact_kernel(target_ptr, drafts_ptr, num_drafts_ptr, starts_ptr, num_accepted_ptr,
                         out_ptr, num_cols, BLOCK: tl.constexpr):  # fmt: skip
    i = tl.program_id(0)
    k = tl.load(num_drafts_ptr + i).to(tl.int32)
    start = tl.load(starts_ptr + i)
    j = tl.arange(0, BLOCK)
    target = tl.load(target_ptr + start + j, mask=j <= k, other=-1)
    draft = tl.load(drafts_ptr + i * num_cols + j, mask=j < k, other=-1)
    mismatch = (j < k) & (draft != target)
    num_accepted = tl.min(tl.where(mismatch, j, k), axis=0)
    out = tl.where(j < num_accepted, draft, tl.where(j == num_accepted, target, -1))
    tl.store(out_ptr + i * (num_cols + 1) + j, out, mask=j <= num_cols)
    tl.store(num_accepted_ptr + i, num_accepted.to(tl.int64))


def verify_exact_fused(
    target_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    first_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted [N] int64, output_token_ids [N, K + 1] int64, -1 past each row's new
    tokens), as verify_exact returns them. target_token_ids: [T] int64; draft_token_ids:
    [N, K] int64, contiguous, padded with -1; num_draft_tokens: [N] int32/int64 (k_i <= K);
    first_rows: [N] int64, request i's first target row (spec_decode.verify.first_rows).
    No host sync."""
    check_tensor("target_token_ids", target_token_ids, 1, (torch.int64,))
    check_tensor("draft_token_ids", draft_token_ids, 2, (torch.int64,))
    check_tensor("num_draft_tokens", num_draft_tokens, 1, (torch.int32, torch.int64))
    check_tensor("first_rows", first_rows, 1, (torch.int64,))
    num_rows, num_cols = draft_token_ids.shape
    check_same("num_draft_tokens.shape[0]", num_draft_tokens.shape[0], "num_rows", num_rows)
    check_same("first_rows.shape[0]", first_rows.shape[0], "num_rows", num_rows)
    if not draft_token_ids.is_contiguous():
        raise ValueError("draft_token_ids must be contiguous")
    device = draft_token_ids.device
    num_accepted = torch.empty(num_rows, dtype=torch.int64, device=device)
    out = torch.empty(num_rows, num_cols + 1, dtype=torch.int64, device=device)
    if num_rows == 0:
        return num_accepted, out
    block = max(MIN_BLOCK, triton.next_power_of_2(num_cols + 1))
    _verify_exact_kernel[(num_rows,)](
        target_token_ids, draft_token_ids, num_draft_tokens, first_rows, num_accepted, out,
        num_cols, BLOCK=block,
    )  # fmt: skip
    return num_accepted, out
