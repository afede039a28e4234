"""How packed sequences split into chunks: the work list of the chunked prefill kernels
(gated delta rule and conv1d). A chunk never straddles two sequences."""

from __future__ import annotations

from typing import NamedTuple

import torch

CHUNK_SIZE = 64


class ChunkLayout(NamedTuple):
    """chunk_table: [num_chunks, 2] int32, each chunk's (sequence, first token); cu_chunks:
    [num_seqs + 1] int32, sequence i owns chunks cu_chunks[i] .. cu_chunks[i + 1] - 1."""

    chunk_table: torch.Tensor
    cu_chunks: torch.Tensor

    @property
    def num_chunks(self) -> int:
        return self.chunk_table.shape[0]


def chunk_layout(
    cu_seqlens: list[int], device: torch.device | str, chunk_size: int = CHUNK_SIZE
) -> ChunkLayout:
    """cu_seqlens: the packed sequences' bounds on the host ([num_seqs + 1], sequences may
    be empty). Built on the host, where the step's inputs are made, so no launch waits on
    a device-to-host copy."""
    table, cu_chunks = [], [0]
    for seq, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        if end < start:
            raise ValueError(f"cu_seqlens must be non-decreasing, got {cu_seqlens}")
        table += [(seq, first) for first in range(start, end, chunk_size)]
        cu_chunks.append(len(table))
    chunk_table = torch.tensor(table, dtype=torch.int32).reshape(-1, 2)
    cu_chunks = torch.tensor(cu_chunks, dtype=torch.int32)
    return ChunkLayout(chunk_table.to(device), cu_chunks.to(device))
