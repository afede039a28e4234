"""CUDA graphs for decode-only steps: one graph per batch size of a ladder, replayed with the
batch padded up to the next captured size. The LM head runs inside the graph."""

from __future__ import annotations

import logging

import torch

from minivllm.attention.base import AttnMetadata
from minivllm.engine.input_prep import StepInputs

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 256, then every 16: padding wastes at most ~6 %."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 1025, 16))
    return [s for s in sizes if s < max_batch_size] + [max_batch_size]


class CUDAGraphRunner:
    def __init__(self, runner, num_blocks: int) -> None:
        self.runner = runner
        config = runner.config
        self.max_batch_size = min(config.max_num_seqs, config.max_cuda_graph_batch_size)
        self.sizes = graph_batch_sizes(self.max_batch_size)
        self.max_model_len = runner.max_model_len
        max_blocks = -(-runner.max_model_len // runner.block_size)
        device = runner.device
        n = self.max_batch_size
        # Static inputs: every replay reads these; run() copies the step's inputs into them.
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((n, max_blocks), dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool = None

    def can_run(self, inputs: StepInputs) -> bool:
        n = inputs.num_tokens
        return (
            n <= self.max_batch_size
            and inputs.num_decode_tokens == n
            and len(inputs.sample_req_ids) == n
        )

    def _meta(self, batch_size: int) -> AttnMetadata:
        # Grids are sized by max_model_len so one graph serves every context length.
        return AttnMetadata(
            query_start_loc=self.query_start_loc[: batch_size + 1],
            seq_lens=self.seq_lens[:batch_size],
            block_tables=self.block_tables[:batch_size],
            slot_mapping=self.slot_mapping[:batch_size],
            max_query_len=1,
            max_seq_len=self.max_model_len,
            num_decode_tokens=batch_size,
        )

    def _forward(self, batch_size: int) -> torch.Tensor:
        model = self.runner.model
        hidden = model(
            self.input_ids[:batch_size], self.positions[:batch_size], self._meta(batch_size)
        )
        return model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        for batch_size in reversed(self.sizes):
            self._forward(batch_size)  # warm-up: compiles kernels outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.logits[batch_size] = self._forward(batch_size)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[batch_size] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def run(self, dev: dict[str, torch.Tensor], num_tokens: int) -> torch.Tensor:
        """Replays the graph of the next captured size for a decode-only step whose inputs
        are already on the device (ModelRunner.to_device)."""
        n = num_tokens
        batch_size = next(s for s in self.sizes if s >= n)
        width = dev["block_tables"].shape[1]
        self.input_ids[:n].copy_(dev["input_ids"])
        self.positions[:n].copy_(dev["positions"])
        self.slot_mapping[:n].copy_(dev["slot_mapping"])
        self.seq_lens[:n].copy_(dev["seq_lens"])
        self.block_tables[:n, :width].copy_(dev["block_tables"])
        # Padded rows: no KV write, a one-token context in block 0; their logits are dropped.
        self.slot_mapping[n:batch_size].fill_(-1)
        self.seq_lens[n:batch_size].fill_(1)
        self.graphs[batch_size].replay()
        return self.logits[batch_size][:n]
