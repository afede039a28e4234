"""The triton backend: minivllm's own kernels over the paged KV cache.

Decode rows (the leading `num_decode_tokens`) go to the decode kernel, split-KV when the batch
is too small to fill the GPU; the remaining rows go to a varlen prefill kernel: the Gluon
FA3-style one on Hopper GPUs with a bf16/fp16 cache in a step large enough to repay its
launch, the Triton one elsewhere (the engine's `prefill_attention_kernel` option).
In deterministic mode every row goes through the batch-invariant kernels
(attention/batch_invariant.py), its prefill rows by the same rule through the Gluon one of
the same bits or the Triton one.
"""

from __future__ import annotations

import torch

from minivllm.attention.base import AttnMetadata
from minivllm.attention.batch_invariant import BatchInvariantAttention
from minivllm.attention.graph_state import DecodeGraphState
from minivllm.kernels import gluon_batch_invariant_attention as gluon_bi
from minivllm.kernels import gluon_prefill_attention as gluon
from minivllm.kernels.batch_invariant_attention import batch_invariant_attention
from minivllm.kernels.decode_attention import MAX_SPLITS, choose_num_splits, decode_attention
from minivllm.kernels.kv_store import store_kv
from minivllm.kernels.prefill_attention import prefill_attention

_DEFAULT_NUM_SMS = 132  # H200; used on CPU (interpreter) where no device can be queried
# "auto" runs the Gluon prefill kernel on a large step: one of at least GLUON_MIN_STEP_TOKENS
# tokens (the GPU time of its other kernels then hides the launch's host time), or one whose
# prefill rows times its longest context reach GLUON_MIN_WORK. In a smaller step both kernels
# are bound by their launch's host time, the Gluon one's about twice the Triton one's (TMA
# descriptors built each launch); alone, the Triton kernel's device time passes the Gluon
# launch's host time at a prompt of a few thousand tokens (measured: docs/kernels.md).
GLUON_MIN_STEP_TOKENS = 4096
GLUON_MIN_WORK = 3584 * 3584


class TritonBackend:
    """Split-KV scratch [max_num_seqs, num_heads, MAX_SPLITS, head_dim] is allocated here,
    once, so the decode path allocates nothing but its output and is graph-capturable."""

    name = "triton"
    supports_cuda_graphs = True

    def __init__(
        self,
        max_num_seqs: int,
        max_model_len: int,
        num_heads: int,
        head_dim: int,
        device: torch.device | str,
        max_splits: int = MAX_SPLITS,
        num_kv_heads: int = 1,
        deterministic: bool = False,
        prefill_kernel: str = "auto",
    ) -> None:
        if max_num_seqs < 1 or max_model_len < 1 or num_heads < 1 or head_dim < 1:
            raise ValueError("max_num_seqs, max_model_len, num_heads and head_dim must be >= 1")
        if not 1 <= max_splits <= 256:
            raise ValueError(f"max_splits must be in [1, 256], got {max_splits}")
        self.device = torch.device(device)
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_splits = max_splits
        self.num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else _DEFAULT_NUM_SMS
        )
        # Partition outputs (normalized) and their log2-sum-exp, float32.
        self.mid_o = torch.empty(
            max_num_seqs, num_heads, max_splits, head_dim, dtype=torch.float32, device=device
        )
        self.mid_lse = torch.empty(
            max_num_seqs, num_heads, max_splits, dtype=torch.float32, device=device
        )
        self.graph_state: DecodeGraphState | None = None
        # "auto", "triton" or "gluon" (EngineConfig.prefill_attention_kernel); where Gluon
        # cannot run at all, "auto" is "triton" and "gluon" an error now.
        unavailable = _gluon_unavailable(self.device)
        if prefill_kernel == "gluon" and unavailable:
            raise ValueError(f"prefill_attention_kernel='gluon' cannot run here: {unavailable}")
        self.prefill_kernel = "triton" if unavailable else prefill_kernel
        # Deterministic mode: every row through the batch-invariant kernel instead.
        self.batch_invariant = None
        if deterministic:
            self.batch_invariant = BatchInvariantAttention(
                max_num_seqs,
                max_model_len,
                num_heads,
                num_kv_heads,
                head_dim,
                self.num_sms,
                self.device,
            )

    # ---- CUDA graphs (CUDAGraphBackend) ---------------------------------------------------

    def init_graph_state(self, max_batch_size: int, max_num_blocks: int) -> None:
        self.graph_state = DecodeGraphState(
            max_batch_size, max_num_blocks, self.max_model_len, self.device
        )

    def metadata_for_capture(self, batch_size: int) -> AttnMetadata:
        # Its max_seq_len is max_model_len: the split-KV plan of the graph fits every length.
        return self.graph_state.metadata(batch_size)

    def prepare_replay(self, batch_size: int, meta: AttnMetadata) -> None:
        self.graph_state.copy_in(batch_size, meta)

    # ---- attention ------------------------------------------------------------------------

    def num_splits(self, num_seqs: int, num_kv_heads: int, max_seq_len: int) -> int:
        """Split-KV partitions for a decode batch whose longest context is max_seq_len."""
        return choose_num_splits(num_seqs, num_kv_heads, max_seq_len, self.num_sms, self.max_splits)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttnMetadata,
        scale: float,
        k_scale: float = 1.0,  # an fp8 cache holds K / k_scale and V / v_scale
        v_scale: float = 1.0,
        out: torch.Tensor | None = None,
        write_kv: bool = True,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        if write_kv:
            store_kv(k, v, kv_cache, meta.slot_mapping, k_scale, v_scale)
        if out is None:
            out = torch.empty_like(q)
        num_decodes = meta.num_decode_tokens
        work = (q.shape[0] - num_decodes) * meta.max_seq_len
        large = q.shape[0] >= GLUON_MIN_STEP_TOKENS or work >= GLUON_MIN_WORK
        if self.batch_invariant is not None:
            prefill_fn = self._prefill_fn(q, kv_cache, large, deterministic=True)
            self.batch_invariant.forward(
                q, kv_cache, meta, scale, out, prefill_fn, k_scale, v_scale
            )
            return out
        num_seqs = meta.num_seqs
        if num_decodes > 0:
            self._decode(q, kv_cache, meta, scale, out, k_scale, v_scale)
        if num_seqs > num_decodes:
            self._prefill_fn(q, kv_cache, large)(
                q,
                kv_cache,
                meta.query_start_loc[num_decodes:],
                meta.seq_lens[num_decodes:],
                meta.block_tables[num_decodes:],
                scale,
                out,
                start_row=num_decodes,  # decodes have one row each
                k_scale=k_scale,
                v_scale=v_scale,
            )
        return out

    def _prefill_fn(
        self, q: torch.Tensor, kv_cache: torch.Tensor, large: bool, deterministic: bool = False
    ):
        """The prefill kernel for these tensors in a step that is large or not (see
        GLUON_MIN_STEP_TOKENS): Gluon's where it supports them (not an fp8 cache, for one)
        unless "triton" was asked for, or "auto" was and the step is not large. deterministic:
        the pair of batch-invariant kernels instead, which give a row the same bits."""
        triton_fn, fast = prefill_attention, gluon
        gluon_fn = gluon.gluon_prefill_attention
        if deterministic:
            triton_fn, fast = batch_invariant_attention, gluon_bi
            gluon_fn = gluon_bi.gluon_batch_invariant_attention
        if self.prefill_kernel == "triton" or (self.prefill_kernel == "auto" and not large):
            return triton_fn
        if fast.supports(q, kv_cache):
            return gluon_fn
        if self.prefill_kernel == "gluon":
            raise ValueError(
                "prefill_attention_kernel='gluon' does not support this model and cache: it "
                f"needs head_dim 64 or 128 (got {q.shape[-1]}), a bf16/fp16 cache of q's dtype "
                f"({q.dtype}; the cache is {kv_cache.dtype}) and blocks of a power of two >= "
                f"{gluon.MIN_BLOCK_SIZE} tokens ({kv_cache.shape[2]})"
            )
        return triton_fn

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttnMetadata,
        scale: float,
        out: torch.Tensor,
        k_scale: float,
        v_scale: float,
    ) -> None:
        num_decodes = meta.num_decode_tokens
        if num_decodes > self.max_num_seqs:
            raise ValueError(f"{num_decodes} decode rows exceed max_num_seqs={self.max_num_seqs}")
        num_splits = self.num_splits(num_decodes, kv_cache.shape[3], meta.max_seq_len)
        decode_attention(
            q[:num_decodes],
            kv_cache,
            meta.block_tables[:num_decodes],
            meta.seq_lens[:num_decodes],
            scale,
            out[:num_decodes],
            num_splits,
            self.mid_o,
            self.mid_lse,
            k_scale=k_scale,
            v_scale=v_scale,
            order=meta.decode_order,
        )


def _gluon_unavailable(device: torch.device) -> str | None:
    """Why the Gluon prefill kernel cannot run on device at all; None if it can (whether it
    takes given tensors is `gluon.supports`'s call)."""
    if gluon.GLUON_IMPORT_ERROR is not None:
        return f"triton's Gluon Hopper API is not importable ({gluon.GLUON_IMPORT_ERROR})"
    if device.type != "cuda":
        return f"it needs a CUDA GPU, the device is {device}"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"it needs a Hopper GPU (compute capability 9.x), this one is {major}.{minor}"
    return None
