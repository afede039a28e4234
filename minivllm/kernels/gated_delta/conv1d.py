"""The causal depthwise conv1d of a Gated DeltaNet layer (SiLU after it) over packed sequences,
each with a conv state slot holding its last width - 1 inputs: prefill and the one-token update.
Torch definitions: `layers/causal_conv1d.py`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.kernels.checks import check_same, check_tensor
from minivllm.kernels.gated_delta.chunk_layout import CHUNK_SIZE, ChunkLayout, chunk_layout


@triton.jit
def _tap_input(x_ptr, state_ptr, src, seq_start, rows_ok, has_init, stride_xt, stride_sw,
               cols, cmask, WIDTH: tl.constexpr):  # fmt: skip
    """Input rows src ([BT] token indices, may reach width - 1 before the sequence start,
    where the conv state (or zeros) stands in) as a [BT, BC] float32 tile."""
    from_x = rows_ok & (src >= seq_start)
    x = tl.load(
        x_ptr + src.to(tl.int64)[:, None] * stride_xt + cols[None, :],
        mask=from_x[:, None] & cmask[None, :], other=0.0,
    )  # fmt: skip
    # Row j of the state is the input width - 1 - j tokens before the sequence start.
    state_row = WIDTH - 1 + src - seq_start
    # has_init is 0 or 1 (an int: the interpreter cannot mask with a scalar bool).
    from_state = rows_ok & (src < seq_start) & (src >= seq_start - has_init * (WIDTH - 1))
    old = tl.load(
        state_ptr + state_row[:, None] * stride_sw + cols[None, :],
        mask=from_state[:, None] & cmask[None, :], other=0.0,
    )  # fmt: skip
    return x.to(tl.float32) + old.to(tl.float32)


@triton.jit(do_not_specialize_on_alignment=["chunk_table_ptr", "cu_seqlens_ptr", "slots_ptr",
                                            "has_init_ptr"])  # fmt: skip
def _conv1d_prefill_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, state_ptr, chunk_table_ptr, cu_seqlens_ptr, slots_ptr,
    has_init_ptr, num_channels, stride_xt, stride_ot, stride_ss, stride_sw,
    WIDTH: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BW: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):  # fmt: skip
    """Grid (num_chunks, cdiv(C, BC)): one program convolves BT tokens of one sequence over
    BC channels. The first chunk's program also writes the sequence's new conv state: it is
    the only one that reads the old state, so it can overwrite it once all its threads have
    read (a barrier: on the GPU a thread's store can overtake another thread's load)."""
    chunk = tl.program_id(0)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cols < num_channels
    seq = tl.load(chunk_table_ptr + 2 * chunk)
    first = tl.load(chunk_table_ptr + 2 * chunk + 1)
    seq_start = tl.load(cu_seqlens_ptr + seq)
    seq_end = tl.load(cu_seqlens_ptr + seq + 1)
    state_ptr += tl.load(slots_ptr + seq).to(tl.int64) * stride_ss
    has_init = tl.load(has_init_ptr + seq).to(tl.int32)
    rows = first + tl.arange(0, BT)
    rows_ok = rows < seq_end
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    for tap in tl.static_range(WIDTH):
        xs = _tap_input(x_ptr, state_ptr, rows - (WIDTH - 1) + tap, seq_start, rows_ok, has_init,
                        stride_xt, stride_sw, cols, cmask, WIDTH)  # fmt: skip
        w = tl.load(w_ptr + cols * WIDTH + tap, mask=cmask, other=0.0).to(tl.float32)
        acc += xs * w[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    out_offs = rows.to(tl.int64)[:, None] * stride_ot + cols[None, :]
    tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty),
             mask=rows_ok[:, None] & cmask[None, :])  # fmt: skip
    if first == seq_start:
        # The new state: the last width - 1 inputs, reaching into the old state if the
        # sequence is shorter than that. The program's threads share the old state's rows:
        # every read of them (the taps above, `new` here) ends before any thread writes.
        j = tl.arange(0, BW)
        new = _tap_input(x_ptr, state_ptr, seq_end - (WIDTH - 1) + j, seq_start, j < WIDTH - 1,
                         has_init, stride_xt, stride_sw, cols, cmask, WIDTH)  # fmt: skip
        tl.debug_barrier()
        tl.store(state_ptr + j[:, None] * stride_sw + cols[None, :],
                 new.to(state_ptr.dtype.element_ty),
                 mask=(j < WIDTH - 1)[:, None] & cmask[None, :])  # fmt: skip


@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "dst_slots_ptr", "rows_ptr"])
def _conv1d_update_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, state_ptr, slots_ptr, dst_slots_ptr, rows_ptr, num_channels,
    stride_xt, stride_ot,
    stride_ss, stride_sw,
    WIDTH: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    HAS_ROWS: tl.constexpr,
):  # fmt: skip
    """Grid (num_requests, cdiv(C, BC)): one token of one request over BC channels (row i of
    x and out, or row rows[i] with HAS_ROWS); the state read at its slot, shifted by one row,
    is written at its dst slot (the same slot: in place). A slot < 0 (padded row) writes
    zeros and leaves every state alone."""
    i = tl.program_id(0).to(tl.int64)
    if HAS_ROWS:
        row = tl.load(rows_ptr + i).to(tl.int64)
    else:
        row = i
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    dst = tl.load(dst_slots_ptr + i).to(tl.int64)
    # A scalar bool cannot mask a vector in the interpreter: padded rows get no columns.
    ok = cols < tl.where(slot >= 0, num_channels, 0)
    dst_ptr = state_ptr + tl.maximum(dst, 0) * stride_ss + cols
    state_ptr += tl.maximum(slot, 0) * stride_ss + cols
    x = tl.load(x_ptr + row * stride_xt + cols, mask=ok, other=0.0).to(tl.float32)
    acc = tl.load(w_ptr + cols * WIDTH + WIDTH - 1, mask=ok, other=0.0).to(tl.float32) * x
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    prev = tl.load(state_ptr, mask=ok, other=0.0)
    for tap in tl.static_range(WIDTH - 1):
        acc += tl.load(w_ptr + cols * WIDTH + tap, mask=ok, other=0.0).to(tl.float32) * prev.to(
            tl.float32
        )
        if tap < WIDTH - 2:
            # Load row tap + 1 before overwriting row tap with it (in place).
            nxt = tl.load(state_ptr + (tap + 1) * stride_sw, mask=ok, other=0.0)
            tl.store(dst_ptr + tap * stride_sw, nxt, mask=ok)
            prev = nxt
    tl.store(dst_ptr + (WIDTH - 2) * stride_sw, x.to(state_ptr.dtype.element_ty), mask=ok)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + row * stride_ot + cols, acc.to(out_ptr.dtype.element_ty),
             mask=cols < num_channels)  # fmt: skip


def _check(x, weight, bias, conv_state, state_slots, activation) -> tuple[int, bool]:
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 2)
    check_tensor("conv_state", conv_state, 3)
    check_tensor("state_slots", state_slots, 1, (torch.int32, torch.int64))
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous: [channels, width]")
    width = weight.shape[1]
    if width < 2:
        raise ValueError(f"conv width must be >= 2, got {width}")
    check_same("weight channels", weight.shape[0], "x channels", x.shape[1])
    check_same("conv_state shape[1:]", tuple(conv_state.shape[1:]), "(width - 1, channels)",
               (width - 1, x.shape[1]))  # fmt: skip
    if bias is not None:
        check_tensor("bias", bias, 1)
        check_same("bias.shape[0]", bias.shape[0], "channels", x.shape[1])
    if activation not in (None, "silu"):
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
    return width, activation == "silu"


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    layout: ChunkLayout | None = None,
) -> torch.Tensor:
    """x: [T, C] packed sequences (rows may be strided), cu_seqlens: [N + 1] int32;
    weight: [C, width]; bias: [C] or None; conv_state: [num_slots, width - 1, C] (row j: the
    input width - 1 - j tokens before the start), read at state_slots [N] where
    has_initial_state [N] (else zeros) and overwritten with each sequence's last inputs.
    layout: the chunks of 64 tokens (`chunk_layout`; built from cu_seqlens, with a
    device-to-host copy, when None). Returns [T, C] in x.dtype."""
    width, silu = _check(x, weight, bias, conv_state, state_slots, activation)
    check_tensor("cu_seqlens", cu_seqlens, 1, (torch.int32,))
    check_same("state_slots", state_slots.shape[0], "num_seqs", cu_seqlens.shape[0] - 1)
    check_same("has_initial_state", has_initial_state.shape[0], "num_seqs", state_slots.shape[0])
    if conv_state.stride(2) != 1:
        raise ValueError("conv_state must be contiguous in its channels")
    if layout is None:
        layout = chunk_layout(cu_seqlens.tolist(), x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if layout.num_chunks == 0:
        return out
    num_channels = x.shape[1]
    block_c = min(64, triton.next_power_of_2(num_channels))
    grid = (layout.num_chunks, triton.cdiv(num_channels, block_c))
    _conv1d_prefill_kernel[grid](
        x, weight, bias if bias is not None else weight, out, conv_state, layout.chunk_table,
        cu_seqlens, state_slots, has_initial_state.to(torch.int32), num_channels, x.stride(0),
        out.stride(0), conv_state.stride(0), conv_state.stride(1),
        WIDTH=width, BT=CHUNK_SIZE, BC=block_c, BW=triton.next_power_of_2(width - 1),
        HAS_BIAS=bias is not None, SILU=silu, num_warps=4,
    )  # fmt: skip
    return out


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    activation: str | None = "silu",
    dst_slots: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per request. x: [N, C] (rows may be strided); conv_state [num_slots,
    width - 1, C] read at state_slots [N] and written at dst_slots [N] (None: in place); a
    slot < 0 is a padded row (state untouched, output zeros). With rows [R] (int64), request
    i's token is row rows[i] of x and of the output, and the slots are [R]. Returns the
    output [N, C] in x.dtype: out where given (only its rows written), else a new tensor.
    Grid (N or R, cdiv(C, BC))."""
    width, silu = _check(x, weight, bias, conv_state, state_slots, activation)
    num_requests = x.shape[0] if rows is None else rows.shape[0]
    check_same("state_slots", state_slots.shape[0], "num_requests", num_requests)
    if dst_slots is None:
        dst_slots = state_slots
    check_tensor("dst_slots", dst_slots, 1, (torch.int32, torch.int64))
    check_same("dst_slots", dst_slots.shape[0], "num_requests", num_requests)
    if conv_state.stride(2) != 1:
        raise ValueError("conv_state must be contiguous in its channels")
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    check_same("out.shape", tuple(out.shape), "x.shape", tuple(x.shape))
    if num_requests == 0:
        return out
    num_channels = x.shape[1]
    block_c = min(256, triton.next_power_of_2(num_channels))
    grid = (num_requests, triton.cdiv(num_channels, block_c))
    _conv1d_update_kernel[grid](
        x, weight, bias if bias is not None else weight, out, conv_state, state_slots,
        dst_slots, state_slots if rows is None else rows, num_channels, x.stride(0),
        out.stride(0), conv_state.stride(0), conv_state.stride(1), WIDTH=width, BC=block_c,
        HAS_BIAS=bias is not None, SILU=silu, HAS_ROWS=rows is not None, num_warps=4,
    )  # fmt: skip
    return out
