"""A request's next chunk: the ScheduledChunk the runner computes, and the request advanced past
it (its blocks, its computed tokens, its pending token and drafts)."""

from __future__ import annotations

from minivllm.engine.sched.drafting import Drafting
from minivllm.engine.sched.request import Request
from minivllm.engine.types import PLACEHOLDER_TOKEN_ID, ScheduledChunk


def add_chunk(
    request: Request,
    num_new_tokens: int,
    new_block_ids: list[int],
    decodes: list[ScheduledChunk],
    others: list[ScheduledChunk],
    drafting: Drafting,
    draft: list[int] | None = None,
) -> None:
    """Appends request's chunk to decodes (one sampled token past the prompt) or others,
    and advances the request past it. new_block_ids: the blocks allocated for it this
    step, which the chunk carries to the runner's copy of the block table. draft: draft
    tokens (or slots) after the last known one, or after the pending one (num_new_tokens
    counts them). With drafts in flight, the chunk starts where they would all be accepted."""
    num_computed_tokens = request.num_computed_tokens
    end = num_computed_tokens + num_new_tokens
    num_known_tokens = len(request.all_token_ids)
    token_ids = request.all_token_ids[num_computed_tokens:end]
    num_draft_tokens = len(draft) if draft else 0
    if end - num_draft_tokens > num_known_tokens:  # the pending token, not known yet
        token_ids.append(PLACEHOLDER_TOKEN_ID)
    if num_draft_tokens:
        token_ids += draft
    num_in_flight = request.num_pending_tokens + request.num_pending_drafts
    sample = end == num_known_tokens + num_in_flight + num_draft_tokens
    num_prior_blocks = len(request.block_ids)
    # Positional: at a thousand chunks a step, keyword arguments cost twice the time.
    chunk = ScheduledChunk(
        request.req_id,
        token_ids,
        num_computed_tokens,
        new_block_ids,
        num_prior_blocks,
        sample,
        num_draft_tokens,
        request.state_slot,
    )
    if num_draft_tokens and request.draft_state_slots:
        chunk.draft_state_slots = request.draft_state_slots
    request.block_ids += new_block_ids
    request.num_computed_tokens = end
    if sample:
        if drafting.active:  # before the chunk's token counts as pending
            drafting.ask(request, chunk)
        request.num_pending_tokens += 1
        request.num_pending_drafts += num_draft_tokens
    if (
        (num_new_tokens == 1 or num_draft_tokens)
        and sample
        and num_computed_tokens >= len(request.prompt_token_ids)
    ):
        decodes.append(chunk)  # one sampled token past the prompt, and its drafts
    else:
        others.append(chunk)
