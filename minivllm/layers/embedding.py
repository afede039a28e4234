"""Vocab-parallel token embedding and LM head.

The vocab is padded to a multiple of 64 * tp_size (aligned matmuls, equal shards); rank r
holds the contiguous rows [r * shard, (r + 1) * shard). Padding rows are zero and the LM head
cuts their logits off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.parallel_state import all_gather_last_dim, get_tp_rank_size
from minivllm.layers.linear import copy_checked
from minivllm.layers.ops import DEFAULT_OPS, LayerOps

VOCAB_PADDING = 64


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        dtype: torch.dtype | None = None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = ops.tp or get_tp_rank_size()
        self.num_embeddings = num_embeddings
        multiple = VOCAB_PADDING * self.tp_size
        self.num_embeddings_padded = (num_embeddings + multiple - 1) // multiple * multiple
        self.shard_size = self.num_embeddings_padded // self.tp_size
        self.vocab_start = self.tp_rank * self.shard_size
        self.vocab_end = self.vocab_start + self.shard_size
        self.weight = nn.Parameter(
            torch.empty(self.shard_size, embedding_dim, dtype=dtype), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader
        self.reduce = ops.reduce

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: object = None
    ) -> None:
        """loaded_weight: the full [vocab_size, hidden]; copies this rank's rows, zeroes padding."""
        if loaded_weight.shape[0] != self.num_embeddings:
            raise ValueError(
                f"shape mismatch: checkpoint has {loaded_weight.shape[0]} vocab rows, "
                f"the model expects vocab_size {self.num_embeddings}"
            )
        num_rows = max(0, min(self.num_embeddings - self.vocab_start, self.shard_size))
        copy_checked(param.data[:num_rows], loaded_weight.narrow(0, self.vocab_start, num_rows))
        param.data[num_rows:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [num_tokens] -> [num_tokens, embedding_dim]."""
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        is_local = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = (input_ids - self.vocab_start) * is_local
        out = F.embedding(local_ids, self.weight) * is_local[:, None].to(self.weight.dtype)
        return self.reduce(out, self.tp_size)


class ParallelLMHead(VocabParallelEmbedding):
    """weight: [vocab_shard, hidden]. For tied embeddings the model assigns the embedding's
    Parameter to `self.weight`."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        dtype: torch.dtype | None = None,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, dtype, ops)
        self.gemm = ops.gemm

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [num_rows, hidden] -> logits [num_rows, vocab_size] (padding cut off)."""
        logits = self.gemm(hidden, self.weight)
        logits = all_gather_last_dim(logits, self.tp_size)
        return logits[:, : self.num_embeddings]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden)
