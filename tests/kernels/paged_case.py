"""Test helpers: random contexts scattered into a paged KV cache, and a plain torch oracle."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class PagedCase:
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    contexts: list[tuple[torch.Tensor, torch.Tensor]]  # per request (k, v): [seq_len, Hkv, D]


def make_paged_case(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
    seed: int = 0,
) -> PagedCase:  # fmt: skip
    """Blocks are a random permutation (block 0 never used), so paging bugs show."""
    gen = torch.Generator().manual_seed(seed)
    counts = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(counts) + 2
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    kv_cache = kv_cache.to(dtype)
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    block_tables = torch.zeros(len(seq_lens), max(counts + [1]) + 1, dtype=torch.int32)
    contexts = []
    for i, (seq_len, count) in enumerate(zip(seq_lens, counts, strict=True)):
        blocks = [perm.pop() for _ in range(count)]
        block_tables[i, :count] = torch.tensor(blocks, dtype=torch.int32)
        slots = torch.tensor(
            [blocks[p // block_size] * block_size + p % block_size for p in range(seq_len)],
            dtype=torch.long,
        )
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        kv_cache[0].view(-1, num_kv_heads, head_dim)[slots] = k
        kv_cache[1].view(-1, num_kv_heads, head_dim)[slots] = v
        contexts.append((k, v))
    return PagedCase(
        kv_cache.to(DEVICE),
        block_tables.to(DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        contexts,
    )


def ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, H, D] at the last n positions of k, v: [L, Hkv, D]; causal, float32 math."""
    n, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    qf = q.float().cpu().transpose(0, 1)  # [H, n, D]
    kf = k.float().cpu().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().cpu().repeat_interleave(group, dim=1).transpose(0, 1)
    s = qf @ kf.transpose(1, 2) * scale  # [H, n, L]
    q_pos = torch.arange(seq_len - n, seq_len)
    s = s.masked_fill(torch.arange(seq_len)[None, :] > q_pos[:, None], float("-inf"))
    return (s.softmax(-1) @ vf).transpose(0, 1)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        # The GPU runs fp32 tl.dot in tf32; the interpreter is exact.
        return {"atol": 2e-3, "rtol": 2e-3} if DEVICE == "cuda" else {"atol": 1e-4, "rtol": 1e-4}
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-2, "rtol": 1e-2}
