"""Piecewise CUDA graphs for mixed steps (prefill chunks, with or without decodes).

Such a step run eagerly costs ~12 kernel launches per layer, and on an H200 host their launch
time exceeded the GPU time of a 1,000-token prefill (measured: docs/performance.md). Here
every stretch of the model between two attentions (the first: embedding to layer 0's q/k/v;
then o_proj, norms, MLP and the next layer's q/k/v; the last: the final norm) is one graph per
token-count bucket, and attention runs eagerly between them on the real tokens with the
step's own metadata, so that graphs never depend on the batch's composition.

The pieces talk through static buffers (input ids, positions, q/k/v, attention output,
residual, hidden); the rows past the step's tokens up to the bucket are padding whose values
nobody reads (every op in a piece is row-wise or a GEMM, so padding rows cannot leak). On the
Triton path a piece also writes the step's K/V into the cache (the RoPE kernel does), at the
slots of a static buffer whose padding rows are reset to -1 every step: no write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from minivllm.attention.base import AttnMetadata
from minivllm.engine.runner.graphs.cuda_graph import capture_graph, padded_size

logger = logging.getLogger(__name__)


def mixed_graph_sizes(max_tokens: int) -> list[int]:
    """16 to 256 doubling, every 256 to 2,048, every 512 beyond: at most ~12 % padding
    above 2,048 tokens, where the GPU time starts to dominate."""
    sizes = [16, 32, 64, 128, 256] + list(range(512, 2049, 256)) + list(range(2560, 65537, 512))
    top = -(-max_tokens // 16) * 16
    return [s for s in sizes if s < top] + [top]


class PiecewiseGraphRunner:
    """model: a decoder whose `model` has embed_tokens, layers (before_attention,
    self_attn.attn, after_attention) and norm (models/llama.py)."""

    def __init__(self, model: nn.Module, max_tokens: int, device: torch.device) -> None:
        self.decoder = model.model
        self.layers = list(self.decoder.layers)
        self.sizes = mixed_graph_sizes(max_tokens)
        rows = self.sizes[-1]
        attn = self.layers[0].self_attn
        hidden_size = self.decoder.embed_tokens.weight.shape[1]
        dtype = self.decoder.embed_tokens.weight.dtype

        def buffer(width: int) -> torch.Tensor:
            # Zeros, so that padding rows hold finite values from the start.
            return torch.zeros(rows, width, dtype=dtype, device=device)

        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        # KV cache slots (the Triton RoPE writes K/V there); -1 on padding rows: no write.
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.q, self.k, self.v = buffer(attn.q_size), buffer(attn.kv_size), buffer(attn.kv_size)
        self.attn_out = buffer(attn.q_size)
        self.residual, self.hidden = buffer(hidden_size), buffer(hidden_size)
        # Per bucket, each piece as a call: a graph's replay (or, uncaptured, the piece itself).
        self.pieces: dict[int, list[Callable[[], None]]] = {}
        self.pool = None

    def can_run(self, num_tokens: int) -> bool:
        return num_tokens <= self.sizes[-1]

    def _piece(self, index: int, rows: int) -> None:
        """Piece `index` over the first `rows` rows: what follows attention `index - 1` (or
        the embedding) up to attention `index` (or the final norm)."""
        if index == 0:
            hidden, residual = self.decoder.embed_tokens(self.input_ids[:rows]), None
        else:
            layer = self.layers[index - 1]
            hidden, residual = layer.after_attention(self.attn_out[:rows], self.residual[:rows])
        if index == len(self.layers):
            hidden, _ = self.decoder.norm(hidden, residual)
            self.hidden[:rows].copy_(hidden)
            return
        q, k, v, residual = self.layers[index].before_attention(
            self.positions[:rows], hidden, residual, self.slot_mapping[:rows]
        )
        self.q[:rows].copy_(q)
        self.k[:rows].copy_(k)
        self.v[:rows].copy_(v)
        self.residual[:rows].copy_(residual)

    @torch.inference_mode()
    def capture(self, use_graphs: bool = True, largest_only: bool = False) -> None:
        """One graph per piece and bucket, largest bucket first, all in one memory pool
        (replays never overlap, and each piece's temporaries die within it). use_graphs=False
        keeps the pieces as plain calls (CPU tests of everything but the capture);
        largest_only captures the largest bucket alone (the memory profile's trial)."""
        for rows in reversed(self.sizes[-1:] if largest_only else self.sizes):
            pieces = []
            for index in range(len(self.layers) + 1):
                if not use_graphs:
                    pieces.append(partial(self._piece, index, rows))
                    continue
                self._piece(index, rows)  # warm-up: compiles kernels outside the capture
                graph, _ = capture_graph(self.pool, self._piece, index, rows)
                self.pool = self.pool or graph.pool()
                pieces.append(graph.replay)
            self.pieces[rows] = pieces
        if use_graphs:
            torch.cuda.synchronize()
            logger.info("captured piecewise CUDA graphs for mixed steps of %s tokens", self.sizes)

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata
    ) -> torch.Tensor:
        """The model's final hidden states [num_tokens, hidden] for a step whose inputs are
        on the device (a view of a static buffer, valid until the next run)."""
        n = input_ids.shape[0]
        rows = padded_size(self.sizes, n)
        pieces = self.pieces[rows]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:rows].fill_(-1)  # a padding row must not overwrite a real slot
        for piece, layer in zip(pieces, self.layers):
            piece()
            layer.self_attn.attn(self.q[:n], self.k[:n], self.v[:n], meta, out=self.attn_out[:n])
        pieces[-1]()
        return self.hidden[:n]
