"""Where a hybrid model's linear-attention layers find each row's recurrent state: the step's
chunks' state slots and whether each prefill chunk continues a state (a later chunk of a
chunked prefill, or a prefix-cache hit, whose slot was restored from a snapshot) or starts a
fresh one (its first position is 0): host arrays, uploaded with the step's other inputs, then
GatedDeltaMeta on the device; in a step with drafts, its decode rows by draft position with the
slots each reads and writes (layers/gated_delta_verify.py). And the step's state copies (restores
before the forward, saves after it), slot to slot."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.runner.cache.state_cache import RecurrentStatePool
from minivllm.engine.runner.input_prep import StepInputs
from minivllm.engine.types import SchedulerOutput
from minivllm.layers.gated_delta_net import GatedDeltaMeta
from minivllm.layers.gated_delta_verify import VerifyRows


def state_arrays(
    inputs: StepInputs, sched_out: SchedulerOutput | None, num_slots: int
) -> dict[str, np.ndarray]:
    """The chunks' state slots "state_slots" [num_chunks], "prefill_cu_seqlens"
    [num_prefills + 1] and "prefill_has_initial_state" [num_prefills] (0 or 1), all int32.
    Without sched_out (the memory profile's dummy step) chunk i takes slot i % num_slots."""
    chunk_start_loc = inputs.chunk_start_loc
    num_chunks = len(chunk_start_loc) - 1
    if sched_out is None:
        slots = (np.arange(num_chunks) % num_slots).astype(np.int32)
    else:
        slots = np.fromiter((c.state_slot for c in sched_out.chunks), np.int32, num_chunks)
        if (slots < 0).any():
            raise RuntimeError("a hybrid model's chunk has no recurrent-state slot")
    num_decodes = _num_decode_chunks(inputs)
    prefill_starts = chunk_start_loc[num_decodes:]
    arrays = {
        "state_slots": slots,
        "prefill_cu_seqlens": (prefill_starts - prefill_starts[0]).astype(np.int32),
        "prefill_has_initial_state": (inputs.positions[prefill_starts[:-1]] > 0).astype(np.int32),
    }
    if num_decodes < inputs.num_decode_tokens:  # some decode chunk has drafts
        assert sched_out is not None
        arrays |= _verify_arrays(sched_out, chunk_start_loc[: num_decodes + 1])
    return arrays


def _num_decode_chunks(inputs: StepInputs) -> int:
    """How many chunks the step's decode rows belong to (fewer than the rows with drafts)."""
    return int(np.searchsorted(inputs.chunk_start_loc, inputs.num_decode_tokens))


def _verify_arrays(sched_out: SchedulerOutput, decode_start_loc: np.ndarray) -> dict:
    """The decode rows ordered by their position in their chunk, "verify_rows" (int64), with
    the slot each reads its states at, "verify_src", and writes them to, "verify_dst" (int32):
    a chunk's first row reads its request's slot, each later row the draft-state slot the row
    before wrote; each row writes its draft-state slot, the last one its request's slot."""
    src, dst, position = [], [], []
    for chunk in sched_out.chunks[: len(decode_start_loc) - 1]:
        own, drafts = chunk.state_slot, chunk.draft_state_slots or []
        assert len(drafts) == chunk.num_draft_tokens, "a draft without a draft-state slot"
        src += [own, *drafts]
        dst += [*drafts, own]
        position += range(len(drafts) + 1)
    order = np.argsort(np.asarray(position), kind="stable")
    return {
        "verify_rows": order.astype(np.int64),
        "verify_src": np.asarray(src, np.int32)[order],
        "verify_dst": np.asarray(dst, np.int32)[order],
    }


def restore_snapshots(pool: RecurrentStatePool, sched_out: SchedulerOutput) -> None:
    """Before the step's forward: each hit's snapshot into its request's slot."""
    copies = sched_out.state_copies
    if copies is not None:
        pool.copy_slots(copies.restore_src, copies.restore_dst)


def save_snapshots(pool: RecurrentStatePool, sched_out: SchedulerOutput) -> None:
    """After the step's forward: the states of the chunks that end on a snapshot point."""
    copies = sched_out.state_copies
    if copies is not None:
        pool.copy_slots(copies.save_src, copies.save_dst)


def gated_delta_meta(inputs: StepInputs, dev: dict[str, torch.Tensor]) -> GatedDeltaMeta:
    """The device arrays of state_arrays as the layers' metadata."""
    slots = dev["state_slots"]
    num_decodes = _num_decode_chunks(inputs)
    verify = None
    if "verify_rows" in dev:
        decode_lens = np.diff(inputs.chunk_start_loc[: num_decodes + 1])
        # Position p's rows: one for each chunk longer than p.
        counts = (decode_lens[None, :] > np.arange(decode_lens.max())[:, None]).sum(1)
        verify = VerifyRows(
            offsets=(0, *np.cumsum(counts).tolist()),
            rows=dev["verify_rows"],
            src_slots=dev["verify_src"],
            dst_slots=dev["verify_dst"],
        )
    return GatedDeltaMeta(
        num_decodes=inputs.num_decode_tokens,
        decode_slots=slots[:num_decodes],
        prefill_cu_seqlens=dev["prefill_cu_seqlens"],
        prefill_slots=slots[num_decodes:],
        prefill_has_initial_state=dev["prefill_has_initial_state"],
        verify=verify,
    )
