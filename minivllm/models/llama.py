"""The Llama dense decoder, shared by Qwen2 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm).

Parameter names match HF checkpoints after packing q/k/v into qkv_proj and gate/up into
gate_up_proj (see `packed_modules_mapping`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from minivllm.attention.base import AttentionBackend, AttnMetadata
from minivllm.layers.activation import SiluAndMul
from minivllm.layers.attention import Attention
from minivllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minivllm.layers.norm import RMSNorm
from minivllm.layers.ops import DEFAULT_OPS, LayerOps
from minivllm.layers.rotary import RotaryEmbedding
from minivllm.models.model_config import ModelConfig


@dataclass(frozen=True)
class DecoderOptions:
    """What differs between the Llama-like families."""

    qkv_bias: bool
    o_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k, before RoPE


class DecoderAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary_emb: RotaryEmbedding,
        attn_backend: AttentionBackend,
        options: DecoderOptions,
        dtype: torch.dtype | None,
        ops: LayerOps,
    ) -> None:
        super().__init__()
        head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=options.qkv_bias,
            dtype=dtype,
            ops=ops,
        )
        self.num_heads = self.qkv_proj.num_heads  # on this rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.q_size = self.qkv_proj.q_size
        self.kv_size = self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * head_dim, config.hidden_size, options.o_bias, dtype, ops
        )
        self.rotary_emb = rotary_emb  # shared by all layers
        # Applied by the rotary embedding (fused into its kernel on the Triton path).
        if options.qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps, dtype)
        else:
            self.q_norm = self.k_norm = None
        scale = head_dim**-0.5
        self.attn = Attention(
            self.num_heads, self.num_kv_heads, head_dim, scale, attn_backend,
            kv_written_by_rope=rotary_emb.use_triton,
        )  # fmt: skip

    def project(
        self, positions: torch.Tensor, hidden: torch.Tensor, slot_mapping: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The attention inputs: q [num_tokens, num_heads * head_dim] and k, v [num_tokens,
        num_kv_heads * head_dim], q and k rotated (and normed first in Qwen3). On the Triton
        path the RoPE kernel also writes k and v into the KV cache at slot_mapping."""
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        kv_write = self.attn.kv_write(v, slot_mapping) if self.attn.kv_written_by_rope else None
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm, kv_write)
        return q, k, v


class DecoderMLP(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
        intermediate_size: int | None = None,
    ) -> None:
        """intermediate_size: None is config's (a shared expert has its own)."""
        super().__init__()
        size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [size, size], bias=False, dtype=dtype, ops=ops
        )
        self.down_proj = RowParallelLinear(size, config.hidden_size, False, dtype, ops)
        self.act_fn = SiluAndMul(use_triton)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


# (config, layer index, dtype, use_triton, ops) -> the layer's MLP: dense, or a MoE block.
MakeMlp = Callable[[ModelConfig, int, torch.dtype | None, bool, LayerOps], nn.Module]


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary_emb: RotaryEmbedding,
        attn_backend: AttentionBackend,
        options: DecoderOptions,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
        mlp: nn.Module,
    ) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(config, rotary_emb, attn_backend, options, dtype, ops)
        self.mlp = mlp
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype, use_triton)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype, use_triton)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        attn_meta: AttnMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v, residual = self.before_attention(
            positions, hidden, residual, attn_meta.slot_mapping
        )
        return self.after_attention(self.self_attn.attn(q, k, v, attn_meta), residual)

    # The layer in two halves around attention, so that the runner can replay each stretch
    # between two attentions as one CUDA graph (engine/runner/graphs/piecewise_graph.py).

    def before_attention(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> q, k, v, residual. The residual stream is carried separately so that each norm
        fuses the add. slot_mapping: the tokens' KV cache slots (-1: padding)."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        return (*self.self_attn.project(positions, hidden, slot_mapping), residual)

    def after_attention(
        self, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """attn_out: [num_tokens, num_heads * head_dim] -> hidden, residual."""
        hidden = self.self_attn.o_proj(attn_out)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        options: DecoderOptions,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
        make_mlp: MakeMlp,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, dtype, ops
        )
        self.rotary_emb = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            dtype,
            use_triton,
        )
        self.layers = nn.ModuleList(
            DecoderLayer(
                config, self.rotary_emb, attn_backend, options, dtype, use_triton, ops,
                make_mlp(config, i, dtype, use_triton, ops),
            )
            for i in range(config.num_hidden_layers)
        )  # fmt: skip
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, use_triton)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_meta: AttnMetadata
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, attn_meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    @classmethod
    def decoder_options(cls, config: ModelConfig) -> DecoderOptions:
        return DecoderOptions(config.attention_bias, config.attention_bias, qk_norm=False)

    @classmethod
    def make_mlp(
        cls,
        config: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
    ) -> nn.Module:
        """Layer layer_idx's MLP; a family with experts returns its MoE block where it has one."""
        return DecoderMLP(config, dtype, use_triton, ops)

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        dtype: torch.dtype | None = None,
        use_triton: bool = False,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        """use_triton: the fused ops (RMSNorm, RoPE, SiLU-mul) run their Triton kernels
        (layers/dispatch.py); attention runs whatever attn_backend is. ops: the GEMM and
        all-reduces of every linear layer, embedding and LM head (layers/ops.py)."""
        super().__init__()
        self.config = config
        options = self.decoder_options(config)
        self.model = DecoderModel(
            config, attn_backend, options, dtype, use_triton, ops, self.make_mlp
        )
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype, ops)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_meta: AttnMetadata
    ) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> hidden [num_tokens, hidden_size] (normed)."""
        return self.model(input_ids, positions, attn_meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [num_rows, hidden_size] -> logits [num_rows, vocab_size]."""
        return self.lm_head.compute_logits(hidden)

    def attention_layers(self) -> list[Attention]:
        """The Attention modules in layer order; the runner binds their kv_cache."""
        return [layer.self_attn.attn for layer in self.model.layers]
