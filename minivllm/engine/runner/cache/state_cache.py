"""The recurrent-state pool of a hybrid model's linear-attention layers on one rank (under
tensor parallelism, the states of its heads): its shape (RecurrentStateSpec), its allocation
(per layer, a conv state and an SSM state of num_slots slots), binding it to the layers, and
the copies between slots that restore and save prefix snapshots. A request's slot is its index
in every layer's pool (the scheduler's KV coordinator hands slots out; every rank's pool has the
same slots); the snapshots' slots follow the running requests' slots. Its share of the cache
budget: state_budget.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.distributed.parallel_state import divide
from minivllm.engine.runner.cache.cache_memory import cache_zeros
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
        cls,
        model_config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        tp_size: int = 1,
    ) -> RecurrentStateSpec | None:
        """None for a model without linear-attention layers. Under tensor parallelism a rank
        keeps the states of its own heads (layers/gated_delta_net.py): 1 / tp_size of each."""
        linear = model_config.linear_attention
        if linear is None:
            return None
        return cls(
            linear.num_linear_layers,
            (linear.conv_kernel_size - 1, divide(linear.conv_dim, tp_size, "conv channels")),
            (divide(linear.num_v_heads, tp_size, "linear_num_value_heads"), linear.head_k_dim,
             linear.head_v_dim),
            dtype,
            device,
        )  # fmt: skip

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of one request's states across all linear-attention layers (SSM in float32)."""
        conv = self.conv_shape[0] * self.conv_shape[1] * self.conv_dtype.itemsize
        ssm = self.ssm_shape[0] * self.ssm_shape[1] * self.ssm_shape[2] * 4
        return self.num_layers * (conv + ssm)

    def allocate(self, num_slots: int) -> RecurrentStatePool:
        """A pool of num_slots slots, zeros."""
        conv = cache_zeros(
            (self.num_layers, num_slots, *self.conv_shape), self.conv_dtype, self.device
        )
        ssm = cache_zeros((self.num_layers, num_slots, *self.ssm_shape), torch.float32, self.device)
        return RecurrentStatePool(conv, ssm)


@dataclass(frozen=True)
class RecurrentStatePool:
    """Every linear-attention layer's states in two tensors: conv [num_layers, num_slots,
    *conv_shape] and ssm [num_layers, num_slots, *ssm_shape] float32."""

    conv: torch.Tensor
    ssm: torch.Tensor

    @property
    def num_slots(self) -> int:
        return self.conv.shape[1]

    def per_layer(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer: (conv_state [num_slots, *conv_shape], ssm_state [num_slots, *ssm_shape])."""
        return list(zip(self.conv.unbind(0), self.ssm.unbind(0), strict=True))

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Slot src[i] into slot dst[i] in every layer, pair by pair, in order (no workspace:
        a batch of gathered slots would take a slot's bytes per pair): a pair may read a slot
        an earlier pair wrote (a verified draft's state saved into a snapshot that a hit of
        the same step restores from)."""
        for s, d in zip(src, dst, strict=True):
            self.conv[:, d].copy_(self.conv[:, s])
            self.ssm[:, d].copy_(self.ssm[:, s])


def bind_recurrent_states(
    layers: Sequence[StatefulGatedDeltaNet], states: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """Gives each linear-attention layer its states (layer order)."""
    for layer, (conv_state, ssm_state) in zip(layers, states, strict=True):
        layer.conv_state, layer.ssm_state = conv_state, ssm_state
