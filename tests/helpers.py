"""Test helpers: attention metadata, KV caches and recurrent states for running a model over
whole prompts."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from minivllm.attention.base import AttnMetadata
from minivllm.layers.gated_delta_net import GatedDeltaMeta


def prefill_metadata(
    seq_lens: list[int], block_size: int, device: torch.device | str = "cpu"
) -> tuple[AttnMetadata, int]:
    """Metadata for prefilling each whole prompt in one packed step; returns (meta, num_blocks).

    Blocks are handed out in reverse order from the top and block 0 stays unused, so that
    a backend that ignores block_tables or reads padding fails.
    """
    blocks_per_seq = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 1
    next_block = num_blocks - 1
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    slots = []
    for i, (seq_len, count) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        blocks = list(range(next_block, next_block - count, -1))
        next_block -= count
        block_tables[i, :count] = torch.tensor(blocks, dtype=torch.int32)
        slots += [
            blocks[pos // block_size] * block_size + pos % block_size for pos in range(seq_len)
        ]
    query_start_loc = [0]
    for seq_len in seq_lens:
        query_start_loc.append(query_start_loc[-1] + seq_len)
    meta = attn_metadata(query_start_loc, seq_lens, block_tables, slots, 0, device)
    return meta, num_blocks


def attn_metadata(
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    slot_mapping: list[int],
    num_decode_tokens: int,
    device: torch.device | str,
) -> AttnMetadata:
    """AttnMetadata on `device` (with its host copies) from lists; block_tables int32."""
    return AttnMetadata(
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
        max_seq_len=max(seq_lens),
        num_decode_tokens=num_decode_tokens,
        query_start_loc_cpu=np.array(query_start_loc, dtype=np.int32),
        seq_lens_cpu=np.array(seq_lens, dtype=np.int32),
    )


def bind_kv_caches(
    model: nn.Module, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """Binds a fresh zeroed [2, num_blocks, block_size, kv_heads, head_dim] cache per layer."""
    caches = []
    for attn in model.attention_layers():
        shape = (2, num_blocks, block_size, attn.num_kv_heads, attn.head_dim)
        attn.kv_cache = torch.zeros(shape, dtype=dtype, device=attn_device(model))
        caches.append(attn.kv_cache)
    return caches


def attn_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefill_logits(model: nn.Module, prompts: list[list[int]], block_size: int = 4) -> list:
    """Runs all prompts in one packed forward; returns per-prompt logits [len, vocab]."""
    device = attn_device(model)
    seq_lens = [len(p) for p in prompts]
    meta, num_blocks = prefill_metadata(seq_lens, block_size, device)
    bind_kv_caches(model, num_blocks, block_size, next(model.parameters()).dtype)
    input_ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=device)
    positions = torch.tensor(
        [i for n in seq_lens for i in range(n)], dtype=torch.long, device=device
    )
    logits = model.compute_logits(model(input_ids, positions, meta))
    return list(logits.split(seq_lens))


@torch.no_grad()
def hybrid_prefill_logits(model, prompts: list[list[int]], block_size: int = 4) -> list:
    """All prompts in one packed forward, each from a fresh recurrent state in slot i + 1
    (slot 0 unused, so that a layer ignoring the slots fails)."""
    seq_lens = [len(p) for p in prompts]
    meta, num_blocks = prefill_metadata(seq_lens, block_size)
    bind_kv_caches(model, num_blocks, block_size)
    linear = model.config.linear_attention
    num_slots = len(prompts) + 1
    for layer in model.recurrent_layers():
        layer.conv_state = torch.full(
            (num_slots, linear.conv_kernel_size - 1, linear.conv_dim), 7.0
        )
        layer.ssm_state = torch.full(
            (num_slots, linear.num_v_heads, linear.head_k_dim, linear.head_v_dim), 7.0
        )
    meta.linear_attn = GatedDeltaMeta(
        num_decodes=0,
        decode_slots=torch.zeros(0, dtype=torch.int32),
        prefill_cu_seqlens=meta.query_start_loc,
        prefill_slots=torch.arange(1, num_slots, dtype=torch.int32),
        prefill_has_initial_state=torch.zeros(len(prompts), dtype=torch.bool),
    )
    input_ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.tensor([i for n in seq_lens for i in range(n)])
    return list(model.compute_logits(model(input_ids, positions, meta)).split(seq_lens))


def rank1(entry: dict) -> tuple[int, float]:
    """(token, logprob) of the rank-1 entry of a prompt_logprobs position."""
    return next((token, lp.logprob) for token, lp in entry.items() if lp.rank == 1)


def top1_figures(reference: list[torch.Tensor], ours: list[list[tuple[int, float]]]) -> dict:
    """Teacher-forced agreement of our (top-1 token, logprob) rows with reference
    log-probabilities [positions, vocab] per prompt: the fraction of positions whose top-1
    equals the reference argmax, and the chosen token's logprob error."""
    agree, errors = [], []
    for ref, row in zip(reference, ours, strict=True):
        assert len(row) == ref.shape[0]
        for pos, (token, logprob) in enumerate(row):
            agree.append(token == int(ref[pos].argmax()))
            errors.append(abs(logprob - float(ref[pos, token])))
    errors_t = torch.tensor(errors)
    return {
        "positions": len(agree),
        "top1_vs_hf_fp32": round(sum(agree) / len(agree), 4),
        "chosen_logprob_abs_err_mean": round(errors_t.mean().item(), 4),
        "chosen_logprob_abs_err_max": round(errors_t.max().item(), 4),
    }
