"""CUDA graphs for decode-only steps: one graph per batch size of a ladder, replayed with the
batch padded up to the next captured size. The LM head runs inside the graph.

The graph runner owns the graphs, the ladder and the model's static inputs (token ids and
positions); the attention backend owns the static attention metadata (CUDAGraphBackend).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

from minivllm.attention.base import AttnMetadata, CUDAGraphBackend

logger = logging.getLogger(__name__)
T = TypeVar("T")


def capture_graph(
    pool: tuple | None, fn: Callable[..., T], *args: object
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Captures fn(*args) into a new graph that allocates from pool (None: a pool of its own;
    graph.pool() shares it with the next captures). Returns the graph and fn's result."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*args)
    return graph, out


def padded_size(sizes: list[int], n: int) -> int:
    """The smallest captured size (sizes ascending) that holds n rows."""
    return sizes[bisect.bisect_left(sizes, n)]


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 256, then every 16: padding wastes at most ~6 %."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 1025, 16))
    return [s for s in sizes if s < max_batch_size] + [max_batch_size]


class CUDAGraphRunner:
    """model: forward(input_ids, positions, meta) -> hidden and compute_logits(hidden)."""

    def __init__(
        self,
        model: nn.Module,
        backend: CUDAGraphBackend,
        max_batch_size: int,
        max_num_blocks: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.backend = backend
        self.max_batch_size = max_batch_size
        self.sizes = graph_batch_sizes(max_batch_size)
        backend.init_graph_state(max_batch_size, max_num_blocks)
        # Static inputs: every replay reads these; run() copies the step's inputs into them.
        self.input_ids = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # Every graph writes its logits into rows of this one buffer (made by the first,
        # largest warm-up): a graph's own output would stay alive in the shared pool, and
        # the outputs of the whole ladder together hold gigabytes.
        self.logits: torch.Tensor | None = None
        self.pool = None

    def can_run(self, num_tokens: int, num_decode_tokens: int, num_sampled: int) -> bool:
        """Whether a step is decode-only (every row samples) and small enough for a graph."""
        return num_tokens <= self.max_batch_size and num_decode_tokens == num_sampled == num_tokens

    def can_replay(self, meta: AttnMetadata) -> bool:
        """Whether the graphs serve a step of this metadata (can_run's sizes aside)."""
        return True

    def capture_metadata(self, batch_size: int) -> AttnMetadata:
        """The static metadata a graph of batch_size rows reads."""
        return self.backend.metadata_for_capture(batch_size)

    def prepare_replay(self, batch_size: int, meta: AttnMetadata) -> None:
        """Copies a live decode batch's metadata into the static buffers."""
        self.backend.prepare_replay(batch_size, meta)

    def _forward(self, batch_size: int) -> torch.Tensor:
        meta = self.capture_metadata(batch_size)
        hidden = self.model(self.input_ids[:batch_size], self.positions[:batch_size], meta)
        logits = self.model.compute_logits(hidden)
        if self.logits is None:
            self.logits = torch.empty_like(logits, memory_format=torch.contiguous_format)
        return self.logits[:batch_size].copy_(logits)

    @torch.inference_mode()
    def capture(self, largest_only: bool = False) -> None:
        """Captures the ladder, largest first (largest_only: that one graph, which holds
        about all the memory of the ladder: the memory profile's trial)."""
        for batch_size in reversed(self.sizes[-1:] if largest_only else self.sizes):
            self._forward(batch_size)  # warm-up: compiles kernels outside the capture
            torch.cuda.synchronize()
            graph, _ = capture_graph(self.pool, self._forward, batch_size)
            self.pool = self.pool or graph.pool()
            self.graphs[batch_size] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata
    ) -> torch.Tensor:
        """Replays the graph of the next captured size for a decode-only step whose inputs
        are on the device; returns its logits [num_tokens, vocab]."""
        n = input_ids.shape[0]
        batch_size = padded_size(self.sizes, n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.prepare_replay(batch_size, meta)
        self.graphs[batch_size].replay()
        return self.logits[:n]
