"""The static attention metadata buffers that a backend's captured CUDA graphs read."""

from __future__ import annotations

import torch

from minivllm.attention.base import AttnMetadata


class DecodeGraphState:
    """Decode metadata buffers for up to max_batch_size requests. Captured graphs read slices
    of them; each replay copies the live batch in first."""

    def __init__(
        self, max_batch_size: int, max_num_blocks: int, max_seq_len: int, device: torch.device
    ) -> None:
        n = max_batch_size
        self.max_seq_len = max_seq_len
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((n, max_num_blocks), dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        # The live rows' launch order, then the padded rows (short: they go last).
        self.decode_order = torch.arange(n, dtype=torch.int32, device=device)
        self._row_order = self.decode_order.clone()  # rows in row order, to copy from

    def metadata(self, batch_size: int) -> AttnMetadata:
        # max_seq_len is the longest context, so that grids sized by it serve every length.
        return AttnMetadata(
            query_start_loc=self.query_start_loc[: batch_size + 1],
            seq_lens=self.seq_lens[:batch_size],
            block_tables=self.block_tables[:batch_size],
            slot_mapping=self.slot_mapping[:batch_size],
            max_seq_len=self.max_seq_len,
            num_decode_tokens=batch_size,
            decode_order=self.decode_order[:batch_size],
        )

    def copy_in(self, batch_size: int, meta: AttnMetadata) -> None:
        n = meta.num_seqs
        width = meta.block_tables.shape[1]
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        order = self._row_order[:n] if meta.decode_order is None else meta.decode_order
        self.decode_order[:n].copy_(order)
        self.decode_order[n:batch_size].copy_(self._row_order[n:batch_size])
        # Padded rows: no KV write, a one-token context in block 0; their outputs are dropped.
        self.slot_mapping[n:batch_size].fill_(-1)
        self.seq_lens[n:batch_size].fill_(1)
