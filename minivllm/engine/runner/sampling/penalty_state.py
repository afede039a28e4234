"""The penalties' per-request state on the device: which tokens a request's prompt holds and how
often each token occurs in its output, one row (slot) of two tables per penalized request.

A step reads the slots of its penalized rows and adds each row's sampled token to its slot on
the device (record), so the next step, even one launched before this one's tokens reach the
host, sees them. Nothing per step grows with prompt or output length: a slot is filled once,
when its request first needs it (from the host's copy of its prompt and output). Slots are as
many as the step's sampled requests can be (max_num_seqs); a request that needs one when none
is free takes the least recently used slot of a request outside the step, which refills its
own slot from the host when it needs one again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from minivllm.engine.runner.device_inputs import list_to_device


class PenaltyState:
    """Tables output_counts [num_slots, width] int32 and prompt_mask [num_slots, width] bool.

    num_slots and width fixed (the engine: max_num_seqs and the vocabulary) allocate them
    once, at construction, so the memory profile that sizes the KV cache sees them. Either
    None (tests of the sampler alone) lets them grow to what the requests need.
    """

    def __init__(
        self, device: torch.device, num_slots: int | None = None, width: int | None = None
    ) -> None:
        self.device = device
        self.fixed_slots = num_slots is not None
        self.fixed_width = width is not None
        self.output_counts = torch.zeros(num_slots or 0, width or 0, dtype=torch.int32,
                                         device=device)  # fmt: skip
        self.prompt_mask = torch.zeros_like(self.output_counts, dtype=torch.bool)
        # req_id -> slot; the step each slot was last used in (the least recently used is
        # evicted when none is free).
        self.slots: dict[str, int] = {}
        self.last_used = np.zeros(num_slots or 0, np.int64)
        self._step = 0
        self.free = list(range(num_slots or 0))
        # req_id -> how many of its output tokens its slot counts, recorded on the device
        # but not yet appended on the host included.
        self.num_counted: dict[str, int] = {}

    @property
    def nbytes(self) -> int:
        return self.output_counts.nbytes + self.prompt_mask.nbytes

    def slots_for(
        self, req_ids: list[str], tokens_of: Callable[[str], tuple[list[int], list[int]]]
    ) -> list[int]:
        """The slot of each request (distinct ids), filling the ones that have none from
        tokens_of(req_id): its (prompt, output) token ids, read only for those."""
        self._step += 1
        slots = self.slots
        result = [slots.get(req_id, -1) for req_id in req_ids]
        if -1 in result:
            step = set(req_ids)
            for i, req_id in enumerate(req_ids):
                if result[i] == -1:
                    prompt, output = tokens_of(req_id)
                    slot = result[i] = self._take_slot(step)
                    self._fill(slot, prompt, output)
                    self.num_counted[req_id] = len(output)
                    slots[req_id] = slot
        self.last_used[result] = self._step
        return result

    def release(self, req_id: str) -> None:
        slot = self.slots.pop(req_id, None)
        if slot is not None:
            self.free.append(slot)
            del self.num_counted[req_id]

    def record(self, slots: torch.Tensor, token_ids: torch.Tensor, req_ids: list[str]) -> None:
        """Adds token_ids [P] (sampled on the device) to slots [P] (distinct) of req_ids."""
        self.output_counts[slots, token_ids] += 1
        for req_id in req_ids:
            self.num_counted[req_id] += 1

    def count_appended(self, req_id: str, num_output: int, token_id: int) -> None:
        """Counts an output token appended on the host (the request's num_output-th) that no
        record() counted: a drafted step's accepted tokens, or tokens appended by hand."""
        slot = self.slots.get(req_id)
        if slot is None or num_output <= self.num_counted[req_id]:
            return
        self._ensure_width(token_id + 1)
        self.output_counts[self.slots[req_id], token_id] += 1
        self.num_counted[req_id] = num_output

    def _take_slot(self, step: set[str]) -> int:
        if self.free:
            return self.free.pop()
        idle = [(self.last_used[slot], req_id) for req_id, slot in self.slots.items()
                if req_id not in step]  # fmt: skip
        if idle:
            req_id = min(idle)[1]  # the least recently used
            del self.num_counted[req_id]
            return self.slots.pop(req_id)
        if self.fixed_slots:
            raise RuntimeError(f"a step samples more than {len(self.slots)} penalized requests")
        self._resize(max(2 * self.output_counts.shape[0], 8), self.output_counts.shape[1])
        return self.free.pop()

    def _fill(self, slot: int, prompt: list[int], output: list[int]) -> None:
        self._ensure_width(max(prompt + output, default=-1) + 1)
        self.prompt_mask[slot] = False
        self.output_counts[slot] = 0
        if prompt:
            self.prompt_mask[slot, list_to_device(prompt, torch.int64, self.device)] = True
        if output:
            ids = list_to_device(output, torch.int64, self.device)
            self.output_counts[slot].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))

    def _ensure_width(self, width: int) -> None:
        if width > self.output_counts.shape[1]:
            if self.fixed_width:
                raise ValueError(f"token id {width - 1} is outside the vocabulary")
            self._resize(self.output_counts.shape[0], max(width, 2 * self.output_counts.shape[1]))

    def _resize(self, num_slots: int, width: int) -> None:
        old_slots, old_width = self.output_counts.shape
        counts = torch.zeros(num_slots, width, dtype=torch.int32, device=self.device)
        mask = torch.zeros(num_slots, width, dtype=torch.bool, device=self.device)
        counts[:old_slots, :old_width] = self.output_counts
        mask[:old_slots, :old_width] = self.prompt_mask
        self.output_counts, self.prompt_mask = counts, mask
        self.free += range(old_slots, num_slots)
        self.last_used = np.concatenate([self.last_used, np.zeros(num_slots - old_slots, np.int64)])
