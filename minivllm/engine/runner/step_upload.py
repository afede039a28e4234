"""A step's inputs on the device: its arrays in one staged copy (device_inputs.py), and the
placeholder tokens (sampled by the step before, still running under async scheduling) filled
in on the device from that step's sampled ids."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.runner.device_inputs import InputStaging
from minivllm.engine.runner.hybrid_inputs import state_arrays
from minivllm.engine.runner.input_prep import StepInputs
from minivllm.engine.types import SchedulerOutput

# The step before's sampled ids [num_sampled] on the device, and their req_ids.
LastSampled = tuple[torch.Tensor, list[str]]


def upload_step(
    staging: InputStaging,
    inputs: StepInputs,
    sched_out: SchedulerOutput | None,
    extra_rows: np.ndarray | None,
    num_state_slots: int | None,
    last_sampled: LastSampled | None,
) -> dict[str, torch.Tensor]:
    """The step's arrays on the device by name, the logits rows followed by extra_rows.
    num_state_slots: a hybrid model's slots for running requests (None: no recurrent
    layers). last_sampled: where the step has placeholder tokens, the step before's."""
    rows = inputs.logits_indices
    if extra_rows is not None:
        rows = np.concatenate([rows, extra_rows])
    arrays = {
        "input_ids": inputs.input_ids,
        "positions": inputs.positions,
        "slot_mapping": inputs.slot_mapping,
        "logits_indices": rows.astype(np.int64, copy=False),
        "query_start_loc": inputs.query_start_loc,
        "seq_lens": inputs.seq_lens,
        "block_tables": inputs.block_tables,
        "decode_order": inputs.decode_order,
    }
    if num_state_slots is not None:
        arrays |= state_arrays(inputs, sched_out, num_state_slots)
    placeholder_rows = np.flatnonzero(inputs.input_ids < 0)
    if placeholder_rows.size:
        # Placeholders only stand for decode tokens, each its chunk's first (drafts follow).
        assert sched_out is not None and placeholder_rows[-1] < inputs.num_decode_tokens
        assert last_sampled is not None
        prev_sampled, prev_req_ids = last_sampled
        prev_row = {req_id: i for i, req_id in enumerate(prev_req_ids)}
        chunks = sched_out.chunks
        chunk_of_row = np.searchsorted(inputs.chunk_start_loc, placeholder_rows, "right") - 1
        arrays["placeholder_rows"] = placeholder_rows.astype(np.int64, copy=False)
        # Row of each placeholder's token in the previous step's sampled ids.
        arrays["prev_rows"] = np.fromiter(
            (prev_row[chunks[c].req_id] for c in chunk_of_row.tolist()),
            np.int64,
            placeholder_rows.size,
        )
    dev = staging.upload(arrays)
    if placeholder_rows.size:
        dev["input_ids"][dev["placeholder_rows"]] = prev_sampled[dev["prev_rows"]]
    return dev
