"""CUDA graphs for the decode steps of a hybrid model: the decode ladder of cuda_graph.py with
the rows' recurrent-state slots as one more static input. The Gated DeltaNet layers of a
captured graph read their slots from it; padded rows carry slot -1 (their states untouched).
Steps with drafts run eagerly."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.attention.base import AttnMetadata, CUDAGraphBackend
from minivllm.engine.runner.graphs.cuda_graph import CUDAGraphRunner
from minivllm.layers.gated_delta_net import GatedDeltaMeta


class HybridCUDAGraphRunner(CUDAGraphRunner):
    def __init__(
        self,
        model: nn.Module,
        backend: CUDAGraphBackend,
        max_batch_size: int,
        max_num_blocks: int,
        device: torch.device,
    ) -> None:
        super().__init__(model, backend, max_batch_size, max_num_blocks, device)
        self.state_slots = torch.full((max_batch_size,), -1, dtype=torch.int32, device=device)
        # A decode-only step has no prefill sequence: empty prefill inputs.
        self._no_prefill = torch.zeros(1, dtype=torch.int32, device=device)

    def can_replay(self, meta: AttnMetadata) -> bool:
        """Not a step with drafts: its rows chain their states position by position
        (layers/gated_delta_verify.py), which a decode graph does not capture. Eager."""
        return meta.linear_attn.verify is None

    def capture_metadata(self, batch_size: int) -> AttnMetadata:
        meta = super().capture_metadata(batch_size)
        empty = self._no_prefill[:0]
        meta.linear_attn = GatedDeltaMeta(
            num_decodes=batch_size,
            decode_slots=self.state_slots[:batch_size],
            prefill_cu_seqlens=self._no_prefill,
            prefill_slots=empty,
            prefill_has_initial_state=empty,
        )
        return meta

    def prepare_replay(self, batch_size: int, meta: AttnMetadata) -> None:
        super().prepare_replay(batch_size, meta)
        slots = meta.linear_attn.decode_slots
        n = slots.shape[0]
        self.state_slots[:n].copy_(slots)
        self.state_slots[n:batch_size].fill_(-1)
