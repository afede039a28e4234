"""What a runner captures and compiles before its first step: the decode steps' CUDA graphs (a
ladder of batch sizes, cuda_graph.py), the piecewise graphs of mixed steps (piecewise_graph.py),
the memory they hold, and the masking and sampling kernels for the model's logits."""

from __future__ import annotations

import logging

import torch
from torch import nn

from minivllm.attention.base import AttentionBackend
from minivllm.engine.runner.graphs.cuda_graph import CUDAGraphRunner
from minivllm.engine.runner.graphs.hybrid_graph import HybridCUDAGraphRunner
from minivllm.engine.runner.graphs.piecewise_graph import PiecewiseGraphRunner
from minivllm.engine.setup import EngineSetup
from minivllm.layers.sampler import Sampler
from minivllm.structured_output.bitmask import allocate_bitmask, apply_bitmask

logger = logging.getLogger(__name__)


class GraphCapture:
    """Captures one runner's graphs: the largest of each kind (the memory profile's trial),
    then all of them once the KV cache is allocated."""

    def __init__(
        self,
        setup: EngineSetup,
        model: nn.Module,
        attn_backend: AttentionBackend,
        device: torch.device,
        hybrid: bool,
    ) -> None:
        """hybrid: the model has recurrent layers (their decode graphs read state slots)."""
        self.setup = setup
        self.model = model
        self.attn_backend = attn_backend
        self.device = device
        self.hybrid = hybrid
        config = setup.config
        # The piecewise graphs of mixed steps split the model at its attention layers.
        self.piecewise_ok = getattr(model, "supports_piecewise_graphs", True)
        if not self.piecewise_ok and device.type == "cuda" and not config.enforce_eager:
            logger.info("%s: mixed steps run eagerly (no piecewise CUDA graphs); decode steps "
                        "replay CUDA graphs", setup.model_config.architecture)  # fmt: skip

    def decode_graphs(self, largest_only: bool = False) -> CUDAGraphRunner:
        """The decode steps' graphs (the caller checks that the backend supports them)."""
        config = self.setup.config
        # A decode step has at most max_num_seqs rows and max_num_batched_tokens tokens.
        max_batch_size = min(*self.setup.limits, config.max_cuda_graph_batch_size)
        graph_class = HybridCUDAGraphRunner if self.hybrid else CUDAGraphRunner
        graphs = graph_class(
            self.model,
            self.attn_backend,
            max_batch_size=max_batch_size,
            max_num_blocks=-(-self.setup.max_model_len // config.block_size),
            device=self.device,
        )
        graphs.capture(largest_only)
        return graphs

    def mixed_graphs(self, largest_only: bool = False) -> PiecewiseGraphRunner | None:
        """The mixed steps' piecewise graphs, or None where they do not run."""
        # Attention runs eagerly between the pieces, so every backend can use them. In
        # deterministic mode too: its GEMMs give a row the same bits whatever M, so padding a
        # step to its bucket changes no bits. Not under TP (collectives inside the pieces not
        # yet run on GPUs): docs/architecture.md.
        config = self.setup.config
        max_tokens = min(self.setup.limits.max_num_batched_tokens, config.max_mixed_graph_tokens)
        if max_tokens < 1 or config.tensor_parallel_size > 1 or not self.piecewise_ok:
            return None
        graphs = PiecewiseGraphRunner(self.model, max_tokens, self.device)
        graphs.capture(largest_only=largest_only)
        return graphs

    def largest(self) -> tuple[object, ...]:
        """The largest graph of each kind the runner will capture (the profile's trial)."""
        graphs = (self.decode_graphs(True) if self.attn_backend.supports_cuda_graphs else None,
                  self.mixed_graphs(True))  # fmt: skip
        return graphs

    def capture(self) -> tuple[CUDAGraphRunner | None, PiecewiseGraphRunner | None, int]:
        """Every graph (CUDA): (decode graphs, mixed graphs, the bytes they hold)."""
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)
        graphs = None
        if self.attn_backend.supports_cuda_graphs:
            graphs = self.decode_graphs()
        else:
            logger.info("attention backend %s runs without CUDA graphs", self.attn_backend.name)
        mixed = self.mixed_graphs()
        # The profile kept what the largest graphs held out of the KV cache's budget.
        torch.cuda.empty_cache()
        graph_bytes = torch.cuda.memory_reserved(self.device) - before
        logger.info("CUDA graphs hold %.2f GiB", graph_bytes / 2**30)
        return graphs, mixed, graph_bytes


@torch.inference_mode()
def compile_masking_and_filters(model: nn.Module, sampler: Sampler, device: torch.device) -> None:
    """Compiles the structured-output mask kernel and the sampler's filtered draws for the
    model's logits (their dtype, width and row stride) now, not in the first step that needs
    them: the engine's warm-up runs no grammar, nor every filter variant. Every token allowed:
    the logits are untouched."""
    embed = model.model.embed_tokens.weight
    hidden = torch.zeros(1, embed.shape[1], dtype=embed.dtype, device=device)
    logits = model.compute_logits(hidden)
    apply_bitmask(logits, allocate_bitmask(1, logits.shape[1]), [0])
    sampler.compile_kernels(logits)
