"""The routed experts of a step's tokens (enable_return_routed_experts): every sparse layer
writes its top-k ids into its column of one static device buffer during the forward (so CUDA
graphs, decode and piecewise, replay the writes), and the runner copies the step's rows into
a pinned host ring behind the step's kernels. The scheduler keeps them per KV slot
(engine/sched/routed_experts.py)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from minivllm.engine.runner.device_inputs import HostCopy
from minivllm.engine.types import RoutedExpertsSpec, StepRouting
from minivllm.layers.moe import SparseMoeBlock

_RING = 3  # steps in flight at once are at most two (launched, being applied)


class RoutedExpertsCapture:
    """buffer: [max_tokens, num_layers, top_k] on the device, allocated with the model (before
    the memory profile, which counts it); row t of a step is its token row t."""

    def __init__(
        self, spec: RoutedExpertsSpec, model: nn.Module, max_tokens: int, device: torch.device
    ) -> None:
        layers = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]  # layer order
        if len(layers) != spec.num_layers:
            raise ValueError(
                f"the model has {len(layers)} sparse layers where its config says {spec.num_layers}"
            )
        dtype = torch.from_numpy(np.zeros(0, spec.dtype)).dtype
        shape = (max_tokens, spec.num_layers, spec.top_k)
        self.buffer = torch.zeros(shape, dtype=dtype, device=device)
        for i, layer in enumerate(layers):
            layer.routed_ids = self.buffer[:, i]
        self._host: list[torch.Tensor] = []
        if device.type == "cuda":
            numel = self.buffer.numel()  # flat: HostCopy views its first elements
            self._host = [torch.empty(numel, dtype=dtype, pin_memory=True) for _ in range(_RING)]
        self._num_steps = 0

    def copy_step(self, num_tokens: int) -> HostCopy:
        """The step's rows [num_tokens, num_layers, top_k], copied to the host behind the
        kernels queued so far (the step's forward): the next forward overwrites the buffer.
        On the CPU a copy at once (the next forward may run before the step is read)."""
        rows = self.buffer[:num_tokens]
        if not self._host:
            return HostCopy(rows.clone(), None)
        self._num_steps += 1
        return HostCopy(rows, self._host[self._num_steps % _RING])


def step_routing(copy: HostCopy, slot_mapping: np.ndarray) -> StepRouting:
    """What RunnerOutput carries: the rows, once their copy is done, and their KV slots."""
    return StepRouting(copy.numpy(), slot_mapping)
