"""Qwen3.5 / 3.6, the text path: a hybrid decoder whose layers are Gated DeltaNet (linear
attention over a per-request recurrent state) or gated full attention (paged KV), as
config.linear_attention.layer_types says; every norm is zero-centred (scale 1 + w). Dense MLPs
here; the MoE variant's experts in qwen3_5_moe.py.

Full attention: q projected to twice its size (the second half of each head a sigmoid gate on
the output), per-head q/k norms, RoPE over a quarter of head_dim. Qwen3_5ForConditionalGeneration
checkpoints hold the same decoder under `model.language_model.`; their vision tower and MTP
head are not loaded (the loader logs them)."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.attention.base import AttentionBackend, AttnMetadata
from minivllm.layers.attention import Attention
from minivllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.gated_delta_net import StatefulGatedDeltaNet
from minivllm.layers.linear import QKVParallelLinear, RowParallelLinear
from minivllm.layers.norm import ZeroCenteredRMSNorm
from minivllm.layers.ops import DEFAULT_OPS, LayerOps
from minivllm.layers.rotary import PartialRotaryEmbedding
from minivllm.models.llama import DecoderMLP, MakeMlp
from minivllm.models.model_config import ModelConfig


class GatedAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        rotary_emb: PartialRotaryEmbedding,
        attn_backend: AttentionBackend,
        dtype: torch.dtype | None,
        ops: LayerOps,
    ) -> None:
        super().__init__()
        head_dim = self.head_dim = config.head_dim
        # Each head's rows of q_proj are its query, then its gate: packed as twice the heads.
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, head_dim, 2 * config.num_attention_heads,
            config.num_key_value_heads, bias=config.attention_bias, dtype=dtype, ops=ops,
        )  # fmt: skip
        self.num_heads = self.qkv_proj.num_heads // 2  # on this rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.kv_size = self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * head_dim, config.hidden_size, config.attention_bias,
            dtype, ops,
        )  # fmt: skip
        self.q_norm = ZeroCenteredRMSNorm(head_dim, config.rms_norm_eps, dtype)
        self.k_norm = ZeroCenteredRMSNorm(head_dim, config.rms_norm_eps, dtype)
        self.rotary_emb = rotary_emb  # shared by all layers
        self.attn = Attention(
            self.num_heads, self.num_kv_heads, head_dim, head_dim**-0.5, attn_backend
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, attn_meta: AttnMetadata
    ) -> torch.Tensor:
        """hidden: [num_tokens, hidden_size] -> [num_tokens, hidden_size]."""
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q_size = 2 * self.num_heads * self.head_dim
        q_gate, k, v = qkv.split([q_size, self.kv_size, self.kv_size], dim=-1)
        # q, gate: [num_tokens, num_heads, head_dim]
        q, gate = q_gate.view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q.reshape(num_tokens, -1), k.reshape(num_tokens, -1), v, attn_meta)
        return self.o_proj(out * torch.sigmoid(gate.reshape(num_tokens, -1)))


class Qwen3_5DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_idx: int,
        rotary_emb: PartialRotaryEmbedding,
        attn_backend: AttentionBackend,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
        mlp: nn.Module,
    ) -> None:
        super().__init__()
        linear = config.linear_attention
        self.is_linear = linear.is_linear(layer_idx)
        if self.is_linear:
            self.linear_attn = StatefulGatedDeltaNet(
                config.hidden_size, linear.num_k_heads, linear.num_v_heads, linear.head_k_dim,
                linear.head_v_dim, linear.conv_kernel_size, config.rms_norm_eps, dtype=dtype,
                use_triton=use_triton, ops=ops,
            )  # fmt: skip
        else:
            self.self_attn = GatedAttention(config, rotary_emb, attn_backend, dtype, ops)
        self.mlp = mlp
        eps = config.rms_norm_eps
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, eps, dtype)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, eps, dtype)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        attn_meta: AttnMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        if self.is_linear:
            if attn_meta.linear_attn is None:
                raise ValueError("a hybrid model's step needs AttnMetadata.linear_attn")
            hidden = self.linear_attn(hidden, attn_meta.linear_attn)
        else:
            hidden = self.self_attn(positions, hidden, attn_meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3_5Model(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
        make_mlp: MakeMlp,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, dtype, ops
        )
        rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        self.rotary_emb = PartialRotaryEmbedding(
            config.head_dim, rotary_dim, config.max_position_embeddings, config.rope_theta, dtype
        )
        self.layers = nn.ModuleList(
            Qwen3_5DecoderLayer(
                config, i, self.rotary_emb, attn_backend, dtype, use_triton, ops,
                make_mlp(config, i, dtype, use_triton, ops),
            )
            for i in range(config.num_hidden_layers)
        )  # fmt: skip
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_meta: AttnMetadata
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, attn_meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3_5ForCausalLM(nn.Module):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    # Checkpoint prefixes that hold no text-decoder weight: the multi-token-prediction head
    # and (conditional-generation checkpoints) the vision tower.
    ignored_checkpoint_prefixes: tuple[str, ...] = ("mtp.", "model.visual.")
    # Checkpoint prefix -> ours (conditional-generation checkpoints nest the decoder).
    checkpoint_prefix_map: dict[str, str] = {}
    # The piecewise graphs of mixed steps split a model at its attention layers, which this one
    # does not offer (its decode steps replay full graphs: engine/runner/graphs/hybrid_graph.py).
    supports_piecewise_graphs = False

    @classmethod
    def make_mlp(
        cls,
        config: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype | None,
        use_triton: bool,
        ops: LayerOps,
    ) -> nn.Module:
        """Layer layer_idx's MLP; the MoE variant returns its experts."""
        return DecoderMLP(config, dtype, use_triton, ops)

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        dtype: torch.dtype | None = None,
        use_triton: bool = False,
        ops: LayerOps = DEFAULT_OPS,
    ) -> None:
        super().__init__()
        if config.linear_attention is None:
            raise ValueError(f"{config.architecture} needs the linear-attention config fields")
        self.config = config
        self.model = Qwen3_5Model(config, attn_backend, dtype, use_triton, ops, self.make_mlp)
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
        """The full-attention layers' Attention modules in order; the runner binds their KV."""
        return [layer.self_attn.attn for layer in self.model.layers if not layer.is_linear]

    def recurrent_layers(self) -> list[StatefulGatedDeltaNet]:
        """The Gated DeltaNet layers in order; the runner binds their recurrent states."""
        return [layer.linear_attn for layer in self.model.layers if layer.is_linear]


class Qwen3_5ForConditionalGeneration(Qwen3_5ForCausalLM):
    """The text path of the vision-language checkpoints (the vision tower is not loaded)."""

    checkpoint_prefix_map = {"model.language_model.": "model."}
