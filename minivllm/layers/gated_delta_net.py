"""A Qwen3.5 Gated DeltaNet layer (the linear-attention layers of the hybrid models): in-projection,
causal conv1d, gates, the gated delta rule over per-request recurrent states, gated RMSNorm and
out-projection, over a step's packed rows (decodes first, then prefill sequences)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.parallel_state import divide, get_tp_rank_size
from minivllm.layers import causal_conv1d, gated_delta
from minivllm.layers.gated_delta_verify import VerifyRows, conv_verify, rule_verify
from minivllm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
    stacked_shard_loader,
)
from minivllm.layers.ops import DEFAULT_OPS, LayerOps


@dataclass(frozen=True)
class GatedDeltaMeta:
    """Where a step's rows are: the first num_decodes rows are one token of a running request
    each (its states at decode_slots [num_decodes] int32, < 0 for a padded row); the rest are
    prefill sequences packed by prefill_cu_seqlens [P + 1] int32 (offsets within those rows),
    their states at prefill_slots [P] int32, read first where prefill_has_initial_state [P]
    (a continued chunk or a cache hit), else started from zeros. verify: in a step with
    drafts, the decode rows by draft position (decode_slots unused; gated_delta_verify.py)."""

    num_decodes: int
    decode_slots: torch.Tensor
    prefill_cu_seqlens: torch.Tensor
    prefill_slots: torch.Tensor
    prefill_has_initial_state: torch.Tensor
    verify: VerifyRows | None = None


class GatedRMSNorm(nn.Module):
    """RMSNorm of x, then times silu(z), per head (HF's order: normalize in float32, cast, scale
    by the weight, then gate in float32)."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * x32.to(x.dtype)
        return (y * F.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """Parameters named as in HF's Qwen3_5GatedDeltaNet. States, handed in by the caller:
    conv_state [num_slots, conv_kernel - 1, 2 * H_k * d_k + H_v * d_v] (model dtype) and
    ssm_state [num_slots, H_v, d_k, d_v] float32, both updated in place, of this rank's heads.
    use_triton: the Triton kernels of `kernels/gated_delta/`; else the torch definitions.

    Tensor parallelism splits the heads: rank r holds key heads [r H_k / tp, (r + 1) H_k / tp)
    and the value heads that read them (value head j reads key head j // (H_v / H_k)), so a
    head's q, k, v, z, b, a, conv channels, decay, state and norm stay on one rank, and the
    out-projection is row-parallel (the layer's one all-reduce)."""

    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel_size: int,
        rms_norm_eps: float,
        dtype: torch.dtype | None = None,
        use_triton: bool = False,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__()
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads {num_v_heads} must be a multiple of {num_k_heads}")
        tp_rank, tp_size = ops.tp or get_tp_rank_size()
        # This rank's heads and sizes (all of them at tp_size 1).
        self.num_k_heads = divide(num_k_heads, tp_size, "linear_num_key_heads")
        self.num_v_heads = divide(num_v_heads, tp_size, "linear_num_value_heads")
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = self.num_k_heads * head_k_dim, self.num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        # The checkpoint's q, k and v rows, each split over the ranks by head.
        qkv_sizes = [num_k_heads * head_k_dim] * 2 + [num_v_heads * head_v_dim]
        self.in_proj_qkv = MergedColumnParallelLinear(hidden_size, qkv_sizes, dtype=dtype, ops=ops)
        self.in_proj_z = ColumnParallelLinear(hidden_size, qkv_sizes[2], dtype=dtype, ops=ops)
        # One row a value head: never quantized (the FP8 checkpoints keep them in bf16).
        gate_ops = replace(ops, linear_method=None)
        self.in_proj_b = ColumnParallelLinear(hidden_size, num_v_heads, dtype=dtype, ops=gate_ops)
        self.in_proj_a = ColumnParallelLinear(hidden_size, num_v_heads, dtype=dtype, ops=gate_ops)
        # A depthwise Conv1d as HF has it (weight [conv_dim, 1, kernel]); only its weight is used.
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, conv_kernel_size, groups=self.conv_dim, bias=False,
            dtype=dtype,
        )  # fmt: skip
        self.conv1d.weight.requires_grad_(False)
        self.conv1d.weight.weight_loader = stacked_shard_loader(qkv_sizes, tp_rank, tp_size)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads, dtype=dtype), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads, dtype=dtype), requires_grad=False)
        for per_head in (self.dt_bias, self.A_log):
            per_head.weight_loader = stacked_shard_loader([num_v_heads], tp_rank, tp_size)
        self.norm = GatedRMSNorm(head_v_dim, rms_norm_eps, dtype=dtype)  # shared by the heads
        self.out_proj = RowParallelLinear(qkv_sizes[2], hidden_size, dtype=dtype, ops=ops)
        self.use_triton = use_triton
        # The torch definitions and the kernels take the same arguments.
        self._conv_update = causal_conv1d.causal_conv1d_update
        self._conv_prefill = causal_conv1d.causal_conv1d_prefill
        self._rule_decode = gated_delta.gated_delta_rule_decode
        self._rule_prefill = gated_delta.gated_delta_rule_prefill
        if use_triton:
            from minivllm.kernels.gated_delta import conv1d, decode, prefill

            self._conv_update, self._conv_prefill = (
                conv1d.causal_conv1d_update,
                conv1d.causal_conv1d_prefill,
            )
            self._rule_decode = decode.gated_delta_rule_decode
            self._rule_prefill = prefill.gated_delta_rule_prefill

    def forward(
        self,
        hidden_states: torch.Tensor,
        meta: GatedDeltaMeta,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
    ) -> torch.Tensor:
        """hidden_states: [num_tokens, hidden] -> [num_tokens, hidden]."""
        num_tokens, n = hidden_states.shape[0], meta.num_decodes
        mixed = self.in_proj_qkv(hidden_states)  # [T, conv_dim]: q, k, v before the conv
        z = self.in_proj_z(hidden_states).view(num_tokens, self.num_v_heads, self.head_v_dim)
        g, beta = gated_delta.gated_delta_gates(
            self.in_proj_a(hidden_states), self.in_proj_b(hidden_states), self.A_log, self.dt_bias
        )
        weight = self.conv1d.weight.view(self.conv_dim, -1)
        conv_out = torch.empty_like(mixed)
        if meta.verify is not None:
            verify = meta.verify
            conv_out[:n] = conv_verify(self._conv_update, mixed[:n], weight, conv_state, verify)
        elif n:
            conv_out[:n] = self._conv_update(
                mixed[:n], weight, None, conv_state, meta.decode_slots, "silu"
            )
        if num_tokens > n:
            conv_out[n:] = self._conv_prefill(
                mixed[n:], weight, None, meta.prefill_cu_seqlens, conv_state,
                meta.prefill_slots, meta.prefill_has_initial_state, "silu",
            )  # fmt: skip
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.view(num_tokens, self.num_k_heads, self.head_k_dim)
        k = k.view(num_tokens, self.num_k_heads, self.head_k_dim)
        v = v.view(num_tokens, self.num_v_heads, self.head_v_dim)
        core = torch.empty_like(v)  # [T, H_v, d_v]
        if meta.verify is not None:
            core[:n] = rule_verify(
                self._rule_decode, q[:n], k[:n], v[:n], g[:n], beta[:n], ssm_state, meta.verify
            )
        elif n:
            core[:n] = self._rule_decode(
                q[:n], k[:n], v[:n], g[:n], beta[:n], ssm_state, meta.decode_slots,
                use_qk_l2norm=True,
            )  # fmt: skip
        if num_tokens > n:
            core[n:] = self._rule_prefill(
                q[n:], k[n:], v[n:], g[n:], beta[n:], meta.prefill_cu_seqlens, ssm_state,
                meta.prefill_slots, meta.prefill_has_initial_state, use_qk_l2norm=True,
            )  # fmt: skip
        core = self.norm(core, z).reshape(num_tokens, self.value_dim)
        return self.out_proj(core)


class StatefulGatedDeltaNet(GatedDeltaNet):
    """A GatedDeltaNet that owns its layer's slice of the recurrent state pool, as Attention
    owns its KV cache: the runner binds conv_state and ssm_state after allocating them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # [num_slots, conv_kernel - 1, conv_dim] and [num_slots, H_v, d_k, d_v] float32;
        # empty until the runner binds them.
        self.conv_state = torch.empty(0)
        self.ssm_state = torch.empty(0)

    def forward(self, hidden_states: torch.Tensor, meta: GatedDeltaMeta) -> torch.Tensor:  # type: ignore[override]
        """hidden_states: [num_tokens, hidden] -> [num_tokens, hidden]."""
        return super().forward(hidden_states, meta, self.conv_state, self.ssm_state)
