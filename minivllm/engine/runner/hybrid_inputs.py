"""Where a hybrid model's linear-attention layers find each row's recurrent state: the step's
chunks' state slots and whether each prefill chunk continues a state (a later chunk of a
chunked prefill, or a prefix-cache hit, whose slot was restored from a snapshot) or starts a
fresh one (its first position is 0): host arrays, uploaded with the step's other inputs, then
GatedDeltaMeta on the device. And the step's snapshot restores and saves, slot to slot."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.runner.input_prep import StepInputs
from minivllm.engine.runner.state_cache import RecurrentStatePool
from minivllm.engine.types import SchedulerOutput
from minivllm.layers.gated_delta_net import GatedDeltaMeta


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
    # One decode row per decode chunk: drafts are refused on hybrid models.
    num_decodes = inputs.num_decode_tokens
    prefill_starts = chunk_start_loc[num_decodes:]
    return {
        "state_slots": slots,
        "prefill_cu_seqlens": (prefill_starts - prefill_starts[0]).astype(np.int32),
        "prefill_has_initial_state": (inputs.positions[prefill_starts[:-1]] > 0).astype(np.int32),
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


def gated_delta_meta(num_decodes: int, dev: dict[str, torch.Tensor]) -> GatedDeltaMeta:
    """The device arrays of state_arrays as the layers' metadata."""
    slots = dev["state_slots"]
    return GatedDeltaMeta(
        num_decodes=num_decodes,
        decode_slots=slots[:num_decodes],
        prefill_cu_seqlens=dev["prefill_cu_seqlens"],
        prefill_slots=slots[num_decodes:],
        prefill_has_initial_state=dev["prefill_has_initial_state"],
    )
