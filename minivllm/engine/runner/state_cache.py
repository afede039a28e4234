"""The recurrent-state pool of a hybrid model's linear-attention layers on one rank: its shape
(RecurrentStateSpec), its allocation (per layer, a conv state and an SSM state of num_slots
slots), binding it to the layers, and its share of the cache budget. A request's slot is its
index in every layer's pool (the scheduler's KV coordinator hands slots out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.engine.runner.kv_cache import KVCacheSpec
from minivllm.engine.setup import EngineSetup
from minivllm.layers.gated_delta_net import StatefulGatedDeltaNet
from minivllm.models.model_config import ModelConfig


@dataclass(frozen=True)
class RecurrentStateSpec:
    """Everything about one rank's state pool but its number of slots."""

    num_layers: int
    conv_shape: tuple[int, int]  # (conv_kernel - 1, conv_dim): the last inputs of the conv
    ssm_shape: tuple[int, int, int]  # (H_v, d_k, d_v): the gated delta rule's state
    conv_dtype: torch.dtype  # the model's (the conv reads its inputs in it)
    device: torch.device

    @classmethod
    def for_model(
        cls, model_config: ModelConfig, dtype: torch.dtype, device: torch.device
    ) -> RecurrentStateSpec | None:
        """None for a model without linear-attention layers."""
        linear = model_config.linear_attention
        if linear is None:
            return None
        return cls(
            linear.num_linear_layers,
            (linear.conv_kernel_size - 1, linear.conv_dim),
            (linear.num_v_heads, linear.head_k_dim, linear.head_v_dim),
            dtype,
            device,
        )

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of one request's states across all linear-attention layers (SSM in float32)."""
        conv = self.conv_shape[0] * self.conv_shape[1] * self.conv_dtype.itemsize
        ssm = self.ssm_shape[0] * self.ssm_shape[1] * self.ssm_shape[2] * 4
        return self.num_layers * (conv + ssm)

    def allocate(self, num_slots: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer: (conv_state [num_slots, *conv_shape], ssm_state [num_slots, *ssm_shape]
        float32), zeros."""
        conv = torch.zeros(
            (self.num_layers, num_slots, *self.conv_shape), dtype=self.conv_dtype,
            device=self.device,
        )  # fmt: skip
        ssm = torch.zeros(
            (self.num_layers, num_slots, *self.ssm_shape), dtype=torch.float32, device=self.device
        )
        return list(zip(conv.unbind(0), ssm.unbind(0), strict=True))


def bind_recurrent_states(
    layers: Sequence[StatefulGatedDeltaNet], states: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """Gives each linear-attention layer its states (layer order)."""
    for layer, (conv_state, ssm_state) in zip(layers, states, strict=True):
        layer.conv_state, layer.ssm_state = conv_state, ssm_state


# ---- the state pool's share of the cache budget ------------------------------------------
# The paged KV and the state pool share one budget. Every running request holds a slot, so
# the slots bound the scheduler's seats: max_num_seqs of them where the pool takes at most a
# quarter of the budget (a third of the KV's bytes), fewer where it would take more, so that
# long contexts keep their KV. Both the runner (allocating) and the engine core (the KV
# coordinator's slots) derive the count from the number of blocks with state_slots_for.


def _specs(setup: EngineSetup) -> tuple[KVCacheSpec, RecurrentStateSpec | None]:
    kv = KVCacheSpec.for_model(
        setup.model_config, setup.config.block_size, setup.kv_cache_dtype, setup.device,
        setup.config.tensor_parallel_size,
    )  # fmt: skip
    return kv, RecurrentStateSpec.for_model(setup.model_config, setup.dtype, setup.device)


def _slots(num_blocks: int, kv: KVCacheSpec, states: RecurrentStateSpec, seats: int) -> int:
    return max(1, min(seats, num_blocks * kv.bytes_per_block // (3 * states.bytes_per_slot)))


def state_slots_for(setup: EngineSetup, num_blocks: int) -> int:
    """How many recurrent-state slots go with num_blocks KV blocks: 0 for a model without
    linear attention; max_num_seqs where num_gpu_blocks_override sidesteps the budget."""
    kv, states = _specs(setup)
    if states is None:
        return 0
    if setup.config.num_gpu_blocks_override is not None:
        return setup.limits.max_num_seqs
    return _slots(num_blocks, kv, states, setup.limits.max_num_seqs)


def blocks_for_budget(setup: EngineSetup, budget_bytes: int) -> int:
    """The most KV blocks that fit budget_bytes beside their state slots (state_slots_for)."""
    kv, states = _specs(setup)
    if states is None:
        return kv.num_blocks_for(budget_bytes)
    seats = setup.limits.max_num_seqs
    lo, hi = 0, max(0, budget_bytes // kv.bytes_per_block)
    while lo < hi:  # the bytes grow with the blocks: the largest count that fits
        mid = (lo + hi + 1) // 2
        used = mid * kv.bytes_per_block + _slots(mid, kv, states, seats) * states.bytes_per_slot
        lo, hi = (mid, hi) if used <= budget_bytes else (lo, mid - 1)
    return lo
