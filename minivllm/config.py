"""Engine configuration: frozen, validated on construction (the model's own config is
minivllm/models/model_config.py). Derived values (number of KV blocks, CUDA graph sizes) are
returned by functions elsewhere, never written back here.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from minivllm.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:
    import torch

    from minivllm.models.model_config import ModelConfig

# torch is imported where a method needs it, not here: the command line builds its flags from
# this class, and `minivllm --help` should not wait seconds for torch.
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    """Every engine option, with vLLM's names. Unknown options raise TypeError."""

    model: str
    tokenizer: str | None = None
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: Literal["auto", "cuda", "cpu"] = "auto"
    tensor_parallel_size: int = 1
    # Engine replicas, each on its own tensor_parallel_size GPUs, behind one frontend.
    data_parallel_size: int = 1
    max_model_len: int | None = None
    # None: chosen at engine build from the device's memory and usage_context
    # (engine/sched/limits.py; 1024 and 16384 offline on an H200).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    load_format: Literal["auto", "dummy"] = "auto"
    seed: int = 0
    attention_backend: Literal["auto", "triton", "torch_sdpa"] = "auto"
    # The triton backend's prefill attention kernel: "auto" runs the Gluon FA3-style kernel
    # where it can (a Hopper GPU, a bf16/fp16 KV cache, head_dim 64 or 128) in a step large
    # enough to repay its launch, and the Triton kernel elsewhere (small steps, fp8 KV caches,
    # other GPUs, the CPU interpreter); "gluon" insists at every size (an error where it
    # cannot run); "triton" always takes the Triton kernel (docs/kernels.md).
    prefill_attention_kernel: Literal["auto", "triton", "gluon"] = "auto"
    # KV cache size on the CPU, in bytes (on CUDA it comes from profiling).
    kv_cache_memory: int = 1 << 30
    # Fixes the number of KV blocks (tests use it to force preemption).
    num_gpu_blocks_override: int | None = None
    # Schedule step N+1 while step N runs (one process, requests without penalties,
    # logprobs or min_tokens); a request that stops on EOS costs one wasted token.
    async_scheduling: bool = True
    # Largest decode batch captured in a CUDA graph.
    max_cuda_graph_batch_size: int = 512
    # Mixed steps (prefill chunks) of up to this many tokens replay piecewise CUDA graphs: the
    # model between two attentions is one graph (engine/runner/graphs/piecewise_graph.py); 0: eager.
    # 8,192: a served step whole (docs/performance.md, "What bounds each shape").
    max_mixed_graph_tokens: int = 8192
    # Batch-invariant numerics: a request's tokens and logprobs do not depend on its
    # neighbours, chunking, prefix hits or graph padding (docs/determinism.md).
    deterministic: bool = False
    # The order requests are served in (vLLM's option): "fcfs", arrival order; "priority", by
    # each request's priority (a lower value first), then arrival, and a preemption takes the
    # lowest-priority running request. A priority other than 0 needs "priority".
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # Most logprobs / prompt_logprobs a request may ask for (vLLM's option); -1: the vocabulary.
    max_logprobs: int = 20
    # KV cache storage (vLLM's option): "auto" = the model's dtype; "fp8" (alias "fp8_e4m3"):
    # e4m3, half the bytes, twice the blocks (docs/kernels.md, "FP8 KV cache").
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3"] = "auto"
    # Weight quantization (vLLM's option): None, the checkpoint's quantization_config (block
    # FP8 checkpoints load as such); "fp8": block FP8 (W8A8, 128 x 128 weight blocks), an
    # unquantized checkpoint quantized as it loads (docs/models.md, "FP8 weights").
    quantization: Literal["fp8"] | None = None
    # Tensor parallelism on CUDA: NCCL for every all-reduce (vLLM's option). False turns on the
    # symmetric-memory one-shot kernel for decode-sized messages (minivllm/distributed/); it is
    # off by default because a TP=2 process using it did not exit after its work on the H200s
    # (docs/parallelism.md).
    disable_custom_all_reduce: bool = True
    # Tensor parallelism across nodes (vLLM's multi-node options): the tensor_parallel_size
    # ranks are spread evenly over `nnodes` machines; node 0 runs the engine (LLM or `minivllm
    # serve`), every other node runs `minivllm serve MODEL --headless --node-rank R ...`. All
    # of them meet at master_addr:master_port (node 0's address, the rendezvous store).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    # A collective (and the start-up rendezvous) that waits longer than this fails: the bound
    # on how long tensor-parallel ranks wait for a peer that hangs or is cut off.
    distributed_timeout_seconds: int = 120
    # Streaming (the server; vLLM's option): a stream is sent a request's new tokens once at
    # least this many have come since its last chunk (its first and last tokens at once).
    # 1 sends every token as it comes; more cuts the server's work per token (fewer chunks,
    # wake-ups and socket writes) at high concurrency, at the cost of burstier streams.
    stream_interval: int = 1
    # The grammar compile cache's bound, in bytes, per engine core (which compiles every spec,
    # a frontend's checks included): compiled structured-output grammars past it are evicted,
    # least recently used first; 0 keeps none (every constrained request compiles again).
    grammar_cache_bytes: int = 512 << 20
    # Which defaults the auto limits take (vLLM's usage context); `minivllm serve` sets "server".
    usage_context: Literal["offline", "server"] = "offline"
    # Speculative decoding (vLLM's option and keys): a SpeculativeConfig, or the dict a user
    # passes (`{"method": "ngram", "num_speculative_tokens": 4, ...}`), validated here into
    # one. None: off (docs/speculative_decoding.md).
    speculative_config: SpeculativeConfig | None = None
    # Mixture-of-experts models (vLLM's option): each finished CompletionOutput carries
    # `routed_experts`, the experts every forwarded token was routed to in every sparse layer
    # ([tokens, sparse layers, top_k]), for a trainer that replays the routing
    # (docs/models.md, "Routed experts"). A model without experts refuses it.
    enable_return_routed_experts: bool = False

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        def check_choice(name: str) -> None:
            choices, value = _CHOICES[name], getattr(self, name)
            check(value in choices, f"{name} must be {'|'.join(choices)}, got {value!r}")

        check_choice("dtype")
        check_choice("device")
        # Here, before anything loads: the CLI and LLM() fail at once, not after a model load.
        import torch

        check(
            self.device != "cuda" or torch.cuda.is_available(),
            "device='cuda' was asked for but no CUDA GPU is available",
        )
        check(self.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1")
        check(self.data_parallel_size >= 1, "data_parallel_size must be >= 1")
        check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len must be >= 1")
        check(
            self.max_num_seqs is None or self.max_num_seqs >= 1,
            f"max_num_seqs must be >= 1, got {self.max_num_seqs}",
        )
        check(
            self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        check(
            self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0,
            f"block_size must be a power of two, got {self.block_size}",
        )
        check(
            0.0 < self.gpu_memory_utilization <= 1.0,
            f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        check_choice("load_format")
        check_choice("attention_backend")
        check_choice("prefill_attention_kernel")
        check(self.kv_cache_memory > 0, "kv_cache_memory must be > 0")
        check(
            self.max_mixed_graph_tokens >= 0,
            f"max_mixed_graph_tokens must be >= 0, got {self.max_mixed_graph_tokens}",
        )
        check(
            self.num_gpu_blocks_override is None or self.num_gpu_blocks_override >= 1,
            "num_gpu_blocks_override must be >= 1",
        )
        is_gguf = os.path.isfile(self.model) and self.model.endswith(".gguf")
        check(
            os.path.isdir(self.model) or is_gguf,
            f"model directory or .gguf file does not exist: {self.model!r}",
        )
        check(
            self.tokenizer is None or os.path.exists(self.tokenizer),
            f"tokenizer directory does not exist: {self.tokenizer!r} (give a local directory)",
        )
        check(
            self.max_logprobs >= -1,
            f"max_logprobs must be -1 (the vocabulary size) or >= 0, got {self.max_logprobs}",
        )
        check_choice("kv_cache_dtype")
        check(
            self.quantization in (None, "fp8"),
            f"quantization must be fp8 or None (the checkpoint's), got {self.quantization!r}",
        )
        self._check_nodes(check)
        check(
            self.stream_interval >= 1, f"stream_interval must be >= 1, got {self.stream_interval}"
        )
        check(
            self.grammar_cache_bytes >= 0,
            f"grammar_cache_bytes (--grammar-cache-bytes) must be >= 0, got "
            f"{self.grammar_cache_bytes}",
        )
        check_choice("usage_context")
        if self.speculative_config is not None and not isinstance(
            self.speculative_config, SpeculativeConfig
        ):
            try:
                spec = SpeculativeConfig.from_dict(self.speculative_config)
            except TypeError as e:  # a wrong key or a non-dict: a bad value, as any other
                raise ValueError(str(e)) from None
            object.__setattr__(self, "speculative_config", spec)

    def _check_nodes(self, check) -> None:
        check(self.nnodes >= 1, f"nnodes must be >= 1, got {self.nnodes}")
        check(
            0 <= self.node_rank < self.nnodes,
            f"node_rank must be in [0, nnodes={self.nnodes}), got {self.node_rank}",
        )
        check(
            self.tensor_parallel_size % self.nnodes == 0,
            f"tensor_parallel_size ({self.tensor_parallel_size}) must be a multiple of nnodes "
            f"({self.nnodes}): every node runs the same number of ranks",
        )
        check(
            self.nnodes == 1 or self.data_parallel_size == 1,
            "data_parallel_size > 1 with nnodes > 1 is not supported (run one replica per "
            "group of nodes behind a router)",
        )
        check(bool(self.master_addr), "master_addr must be a host name or address")
        check(
            0 < self.master_port < 65536,
            f"master_port must be in [1, 65535], got {self.master_port}",
        )
        check(
            self.distributed_timeout_seconds >= 1,
            f"distributed_timeout_seconds must be >= 1, got {self.distributed_timeout_seconds}",
        )

    @classmethod
    def from_options(cls, model: str, **options: Any) -> EngineConfig:
        """Builds the config from LLM(...) keyword options; an unknown name is a TypeError."""
        known = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known options: {sorted(known)}")
        return cls(model=model, **options)

    def resolved_tokenizer(self) -> str:
        """Where the tokenizer is read from: `tokenizer`, else the model (an HF dir or GGUF)."""
        return self.tokenizer or self.model

    def resolved_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The KV cache's element type: the model's, or float8_e4m3fn for fp8."""
        import torch

        return model_dtype if self.kv_cache_dtype == "auto" else torch.float8_e4m3fn

    def resolved_dtype(self, model_config: ModelConfig, device: torch.device) -> torch.dtype:
        """auto: the checkpoint's dtype on CUDA (float32 -> bfloat16 there), float32 on CPU."""
        import torch

        if self.dtype != "auto":
            return getattr(torch, self.dtype)
        if device.type == "cpu":
            return torch.float32
        name = model_config.torch_dtype
        dtype = getattr(torch, name) if name in DTYPES else torch.bfloat16
        return torch.bfloat16 if dtype == torch.float32 else dtype

    def resolved_max_model_len(self, model_config: ModelConfig) -> int:
        limit = model_config.max_position_embeddings
        if self.max_model_len is None:
            return limit
        if self.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's "
                f"max_position_embeddings={limit}"
            )
        return self.max_model_len


def _literal_choices(cls: type) -> dict[str, tuple[str, ...]]:
    """Field name -> its allowed values, for every field typed with a Literal."""
    hints = typing.get_type_hints(cls)
    return {
        name: typing.get_args(hint)
        for name, hint in hints.items()
        if typing.get_origin(hint) is Literal
    }


_CHOICES = _literal_choices(EngineConfig)
