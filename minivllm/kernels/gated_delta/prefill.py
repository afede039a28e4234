"""The chunked gated delta rule for prefill over packed sequences, each starting from (and
leaving its final state in) its state slot: three launches (`chunk_kernels.py`). Torch
definition: `layers/gated_delta.py` (`gated_delta_rule_prefill`)."""

from __future__ import annotations

import torch
import triton

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.gated_delta.chunk_kernels import (
    _chunk_output_kernel,
    _chunk_prepare_kernel,
    _chunk_state_kernel,
)
from minivllm.kernels.gated_delta.chunk_layout import CHUNK_SIZE, ChunkLayout, chunk_layout
from minivllm.kernels.gated_delta.common import check_rule_inputs


def gated_delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    layout: ChunkLayout | None = None,
) -> torch.Tensor:
    """Packed sequences (cu_seqlens [N + 1] int32). q, k: [T, H_k, d_k]; v: [T, H_v, d_v]
    (rows may be strided); g (log decay, <= 0), beta: [T, H_v]; state: [num_slots, H_v, d_k,
    d_v] float32: sequence i starts from state[state_slots[i]] where has_initial_state[i]
    (else zeros) and its final state is written there (an empty sequence leaves it alone).
    scale defaults to d_k ** -0.5. layout: the chunks of 64 tokens (`chunk_layout`; built
    from cu_seqlens, with a device-to-host copy, when None). Returns [T, H_v, d_v] in v.dtype.

    Grids: prepare (num_chunks, H_v); state (N, H_v, cdiv(d_v, BV)); output (num_chunks,
    H_v, cdiv(d_v, BV)). Scratch: gc [T, H_v] float32; w, u, v_new [T, H_v, d] and h
    [num_chunks, H_v, d_k, d_v] in the op dtype (q's)."""
    check_rule_inputs(q, k, v, g, beta, state)
    check_tensor("cu_seqlens", cu_seqlens, 1, (torch.int32,))
    check_tensor("state_slots", state_slots, 1, (torch.int32, torch.int64))
    num_seqs = cu_seqlens.shape[0] - 1
    check_same("state_slots", state_slots.shape[0], "num_seqs", num_seqs)
    check_same("has_initial_state", has_initial_state.shape[0], "num_seqs", num_seqs)
    if layout is None:
        layout = chunk_layout(cu_seqlens.tolist(), v.device)
    num_tokens, num_v_heads, d_v = v.shape
    d_k = q.shape[2]
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if num_tokens == 0:
        return out
    op, dev = q.dtype, v.device
    gc = torch.empty((num_tokens, num_v_heads), dtype=torch.float32, device=dev)
    w = torch.empty((num_tokens, num_v_heads, d_k), dtype=op, device=dev)
    u = torch.empty((num_tokens, num_v_heads, d_v), dtype=op, device=dev)
    v_new = torch.empty_like(u)
    h = torch.empty((layout.num_chunks, num_v_heads, d_k, d_v), dtype=op, device=dev)
    block_k, block_v = triton.next_power_of_2(d_k), triton.next_power_of_2(d_v)
    split_v = min(64, block_v)
    shapes = dict(
        HEADS_PER_K=num_v_heads // q.shape[1], H_V=num_v_heads, D_K=d_k, D_V=d_v,
        BT=CHUNK_SIZE, BK=block_k, L2NORM=use_qk_l2norm,
        # Float32 inputs get exact float32 dots (tf32 would cost ~3 decimal digits).
        PRECISION="ieee" if op == torch.float32 else "tf32",
    )  # fmt: skip
    _chunk_prepare_kernel[(layout.num_chunks, num_v_heads)](
        k, v, g, beta, gc, w, u, layout.chunk_table, cu_seqlens,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        BV=block_v, **shapes, num_warps=8,
    )  # fmt: skip
    _chunk_state_kernel[(num_seqs, num_v_heads, triton.cdiv(d_v, split_v))](
        k, gc, w, u, h, v_new, state, cu_seqlens, layout.cu_chunks, state_slots,
        has_initial_state.to(torch.int32), k.stride(0), k.stride(1), state.stride(0),
        state.stride(1), BV=split_v, **shapes, num_warps=8,
    )  # fmt: skip
    _chunk_output_kernel[(layout.num_chunks, num_v_heads, triton.cdiv(d_v, split_v))](
        q, k, gc, h, v_new, out, layout.chunk_table, cu_seqlens,
        d_k**-0.5 if scale is None else scale, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), out.stride(0), out.stride(1), BV=split_v, **shapes, num_warps=4,
    )  # fmt: skip
    return out
