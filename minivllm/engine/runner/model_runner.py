"""ModelRunner: owns the model, the KV cache and the sampler on one device (one TP rank).

Its interface to the engine core, one step in two calls: `forward(SchedulerOutput) ->
ForwardStep` launches the forward, `sample(ForwardStep, GrammarOutput | None) -> StepHandle`
masks and samples its logits; the handle's result() waits for the tokens.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from minivllm.attention.base import AttnMetadata
from minivllm.attention.selector import get_attn_backend
from minivllm.distributed.all_reduce import create_symm_buffer
from minivllm.engine.runner.block_table import BlockTable
from minivllm.engine.runner.cuda_graph import CUDAGraphRunner
from minivllm.engine.runner.device_inputs import InputStaging
from minivllm.engine.runner.draft_slots import (
    FilledStep,
    draft_slots,
    fill_draft_slots,
    grammar_for_step,
    needs_filling,
    sampled_row_map,
)
from minivllm.engine.runner.draft_step import DraftedStep, SyntheticAcceptance, draft_token_ids
from minivllm.engine.runner.drafter import Drafter
from minivllm.engine.runner.hybrid_graph import HybridCUDAGraphRunner
from minivllm.engine.runner.hybrid_inputs import (
    gated_delta_meta,
    restore_snapshots,
    save_snapshots,
    state_arrays,
)
from minivllm.engine.runner.input_prep import StepInputs, prepare_inputs
from minivllm.engine.runner.kv_cache import KVCacheSpec, bind_kv_caches
from minivllm.engine.runner.piecewise_graph import PiecewiseGraphRunner, mixed_graph_sizes
from minivllm.engine.runner.pooling import PoolingRunner, pooling_reserve_bytes
from minivllm.engine.runner.profiling import (
    memory_baseline,
    profile_kv_budget,
    sample_worst_case,
)
from minivllm.engine.runner.prompt_logprobs import PROMPT_ROWS_PER_PASS, PromptLogprobsTracker
from minivllm.engine.runner.routed_experts import RoutedExpertsCapture
from minivllm.engine.runner.sampling_state import SamplingState
from minivllm.engine.runner.state_budget import blocks_for_budget, state_budget_for
from minivllm.engine.runner.state_cache import (
    RecurrentStatePool,
    RecurrentStateSpec,
    bind_recurrent_states,
)
from minivllm.engine.runner.step_handle import ForwardStep, StepHandle
from minivllm.engine.setup import EngineSetup
from minivllm.engine.types import GrammarOutput, RunnerOutput, SchedulerOutput
from minivllm.layers.dispatch import use_triton_kernels
from minivllm.layers.invariant_gemm import InvariantGemm
from minivllm.layers.ops import layer_ops
from minivllm.layers.sampler import Sampler
from minivllm.layers.tuned_gemm import TunedGemm
from minivllm.model_loader import build_model
from minivllm.spec_decode.proposer import Proposer
from minivllm.structured_output.bitmask import allocate_bitmask, apply_bitmask

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, setup: EngineSetup, device: torch.device) -> None:
        """device: this rank's device (setup.device, with the rank's index under TP)."""
        config = self.config = setup.config
        model_config = setup.model_config
        self.device = device
        self.max_model_len = max_model_len = setup.max_model_len
        self.tp_size = tp_size = config.tensor_parallel_size
        self.block_size = config.block_size
        self.limits = setup.limits
        max_num_seqs = self.limits.max_num_seqs
        self.memory_baseline = 0
        if device.type == "cuda":
            self.memory_baseline = memory_baseline(device, config.gpu_memory_utilization)
        tp_heads = model_config.num_attention_heads // tp_size
        self.attn_backend = get_attn_backend(
            config.attention_backend,
            device,
            num_heads=tp_heads,
            head_dim=model_config.head_dim,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            num_kv_heads=max(1, model_config.num_key_value_heads // tp_size),
            deterministic=config.deterministic,
            prefill_kernel=config.prefill_attention_kernel,
        )
        # The layers' GEMM and all-reduces, chosen once; the symmetric-memory buffer (collective)
        # before profiling and graph capture, which must see the all-reduce the steps use.
        symm = None
        if tp_size > 1 and device.type == "cuda" and not config.disable_custom_all_reduce:
            symm = create_symm_buffer(device)
        max_rows = max(self.limits.max_num_batched_tokens, max_num_seqs)
        ops = layer_ops(config.deterministic, symm, device, max_rows, single_rank=tp_size == 1)
        self.model = build_model(
            model_config,
            self.attn_backend,
            dtype=setup.dtype,
            device=device,
            model_dir=config.model,
            load_format=config.load_format,
            seed=config.seed,
            ops=ops,
            quant=setup.quantization,
        )
        if isinstance(ops.gemm, InvariantGemm | TunedGemm):
            ops.gemm.verify_model(self.model, device)
        # The routed experts' static buffer, before the memory profile (which counts it), with
        # a row for each row of the largest forward (a piecewise graph's bucket rounds up).
        self.routed_experts: RoutedExpertsCapture | None = None
        if setup.routed_experts is not None:
            rows = mixed_graph_sizes(max_rows)[-1]
            self.routed_experts = RoutedExpertsCapture(
                setup.routed_experts, self.model, rows, device
            )
        self.sampler = Sampler(use_triton_kernels(device))
        # The penalty tables (max_num_seqs x vocabulary) are allocated now: the memory
        # profile that sizes the KV cache counts them.
        self.sampling_state = SamplingState(
            device, config.seed, max_num_seqs, model_config.vocab_size
        )
        # Drafts kept by forced rates (benchmarks), or None: by the target's own draws.
        self.synthetic_acceptance = SyntheticAcceptance.for_config(
            config.speculative_config, device, config.seed
        )
        self.prompt_logprobs = PromptLogprobsTracker()
        # Drafts for the next step, proposed after a step's tokens are read (attach_proposer).
        self.drafter: Drafter | None = None
        self.pooling = PoolingRunner(self.model.compute_logits)  # pooling requests' state
        self.block_table = BlockTable(-(-max_model_len // self.block_size), max_num_seqs)
        self.kv_spec = KVCacheSpec.for_model(
            model_config, self.block_size, setup.kv_cache_dtype, device, tp_size
        )
        self.kv_caches: list[torch.Tensor] = []
        self.setup = setup
        self.state_spec = RecurrentStateSpec.for_model(model_config, setup.dtype, device, tp_size)
        # Hybrid models: the recurrent-state pool (running requests' slots, then snapshots').
        self.state_pool: RecurrentStatePool | None = None
        self.num_state_slots = 0  # the pool's slots for running requests
        if self.state_spec is not None:
            self._bind_state_pool(1, 1)  # for the memory profile's trial step; sized with the KV
        # The piecewise graphs of mixed steps split the model at its attention layers.
        self._piecewise_ok = getattr(self.model, "supports_piecewise_graphs", True)
        if not self._piecewise_ok and device.type == "cuda" and not config.enforce_eager:
            logger.info("%s: mixed steps run eagerly (no piecewise CUDA graphs); decode steps "
                        "replay CUDA graphs", model_config.architecture)  # fmt: skip
        self.graphs: CUDAGraphRunner | None = None  # once captured
        self.mixed_graphs: PiecewiseGraphRunner | None = None  # likewise
        # The last step's sampled ids [num_sampled] on the device, and their req_ids.
        self._last_sampled: tuple[torch.Tensor, list[str]] | None = None
        # The last step's handle and draft slots: a next step's chunks may wait for them
        # (async scheduling with drafts, runner/draft_slots.py).
        self._last_handle: StepHandle | None = None
        self._last_draft_slots: dict[str, int] = {}
        self._host_ids: list[torch.Tensor] | None = None
        if device.type == "cuda":
            # Sized for ids and up to 20 logprobs a row: a larger step grows its slot once.
            numel = max_num_seqs * (1 + 2 * 21 + 1)
            self._host_ids = [
                torch.empty(numel, dtype=torch.int64, pin_memory=True) for _ in range(3)
            ]
        self._num_steps = 0
        self.graph_bytes = 0  # the memory the captured CUDA graphs hold, once captured
        # A step's input arrays go to the device in one copy from reused pinned buffers,
        # sized for the largest step's token arrays (block tables grow them when needed).
        max_tokens = self.limits.max_num_batched_tokens
        self._staging = InputStaging(device, capacity=32 * max_tokens + 64 * max_num_seqs)

    # ---- KV cache -------------------------------------------------------------------------

    def _bind_state_pool(self, num_slots: int, num_running: int) -> None:
        """A fresh (zeroed) recurrent-state pool of num_slots slots, the first num_running for
        running requests, for the linear-attention layers; the old one is dropped first."""
        layers = self.model.recurrent_layers()
        bind_recurrent_states(layers, [(torch.empty(0), torch.empty(0))] * len(layers))
        self.state_pool = None
        self.state_pool = self.state_spec.allocate(num_slots)
        bind_recurrent_states(layers, self.state_pool.per_layer())
        self.num_state_slots = num_running

    def determine_num_blocks(self) -> int:
        """How many KV blocks fit: an override, a byte budget on the CPU, profiling on CUDA."""
        if self.config.num_gpu_blocks_override is not None:
            return self.config.num_gpu_blocks_override
        if self.device.type != "cuda":
            return blocks_for_budget(self.setup, self.config.kv_cache_memory)
        budget = profile_kv_budget(
            self.run_model,
            self.model.attention_layers(),
            self.kv_spec,
            self.limits.max_num_batched_tokens,
            self.limits.max_num_seqs,
            self.max_model_len,
            self.config.gpu_memory_utilization,
            self.memory_baseline,
            self._sample_worst_case,
            pooling_reserve_bytes(
                self.setup.model_config.hidden_size, self.setup.dtype, self.limits.max_num_seqs
            ),
            None if self.config.enforce_eager else self._capture_largest_graphs,
        )
        return blocks_for_budget(self.setup, budget)

    def _capture_largest_graphs(self) -> tuple[object, ...]:
        """The largest graph of each kind the runner will capture (the profile's trial)."""
        graphs = (self._capture_graphs(True) if self.attn_backend.supports_cuda_graphs else None,
                  self._capture_mixed_graphs(True))  # fmt: skip
        return graphs

    @torch.inference_mode()
    def _sample_worst_case(self, logits: torch.Tensor) -> None:
        sample_worst_case(self.sampling_state, self.sampler, logits, self.config.max_logprobs)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = self.kv_spec.allocate(num_blocks)
        bind_kv_caches(self.model.attention_layers(), self.kv_caches)
        if self.state_spec is not None:
            budget = state_budget_for(self.setup, num_blocks)
            self._bind_state_pool(budget.num_pool_slots, budget.num_state_slots)
            logger.info(
                "recurrent states: %d slots for running requests, %d prefix-cache snapshots "
                "(%.2f GiB)", budget.num_state_slots, budget.num_snapshot_slots,
                budget.num_pool_slots * self.state_spec.bytes_per_slot / 2**30,
            )  # fmt: skip
        backend = self.attn_backend
        if self.device.type == "cuda" and not self.config.enforce_eager:
            torch.cuda.empty_cache()
            before = torch.cuda.memory_reserved(self.device)
            if backend.supports_cuda_graphs:
                self.graphs = self._capture_graphs()
            else:
                logger.info("attention backend %s runs without CUDA graphs", backend.name)
            self.mixed_graphs = self._capture_mixed_graphs()
            # The profile kept what the largest graphs held out of the KV cache's budget.
            torch.cuda.empty_cache()
            self.graph_bytes = torch.cuda.memory_reserved(self.device) - before
            logger.info("CUDA graphs hold %.2f GiB", self.graph_bytes / 2**30)
        if self.device.type == "cuda":
            self._compile_masking_and_filters()

    @torch.inference_mode()
    def _compile_masking_and_filters(self) -> None:
        """Compiles the structured-output mask kernel and the sampler's filtered draws for
        this model's logits (their dtype, width and row stride) now, not in the first step
        that needs them: the engine's warm-up runs no grammar, nor every filter variant.
        Every token allowed: the logits are untouched."""
        embed = self.model.model.embed_tokens.weight
        hidden = torch.zeros(1, embed.shape[1], dtype=embed.dtype, device=self.device)
        logits = self.model.compute_logits(hidden)
        apply_bitmask(logits, allocate_bitmask(1, logits.shape[1]), [0])
        self.sampler.compile_kernels(logits)

    def _capture_mixed_graphs(self, largest_only: bool = False) -> PiecewiseGraphRunner | None:
        # Attention runs eagerly between the pieces, so every backend can use them. In
        # deterministic mode too: its GEMMs give a row the same bits whatever M, so padding a
        # step to its bucket changes no bits. Not under TP (collectives inside the pieces not
        # yet run on GPUs): docs/architecture.md.
        max_tokens = min(self.limits.max_num_batched_tokens, self.config.max_mixed_graph_tokens)
        if max_tokens < 1 or self.tp_size > 1 or not self._piecewise_ok:
            return None
        graphs = PiecewiseGraphRunner(self.model, max_tokens, self.device)
        graphs.capture(largest_only=largest_only)
        return graphs

    def _capture_graphs(self, largest_only: bool = False) -> CUDAGraphRunner:
        # A decode step has at most max_num_seqs rows and max_num_batched_tokens tokens.
        max_batch_size = min(*self.limits, self.config.max_cuda_graph_batch_size)
        graph_class = CUDAGraphRunner if self.state_spec is None else HybridCUDAGraphRunner
        graphs = graph_class(
            self.model,
            self.attn_backend,
            max_batch_size=max_batch_size,
            max_num_blocks=-(-self.max_model_len // self.block_size),
            device=self.device,
        )
        graphs.capture(largest_only)
        return graphs

    def attach_proposer(self, proposer: Proposer) -> None:
        """Speculative decoding: after each step, `proposer` drafts the next step's tokens
        of the chunks that ask (runner/drafter.py). Rank 0's runner only: its RunnerOutput
        is the one the scheduler reads."""
        self.drafter = Drafter(proposer)

    # ---- one step -------------------------------------------------------------------------

    def execute(
        self, sched_out: SchedulerOutput, grammar: GrammarOutput | None = None
    ) -> RunnerOutput:
        """Runs one step and waits for its tokens."""
        return self.sample(self.forward(sched_out), grammar).result()

    def forward(self, sched_out: SchedulerOutput) -> ForwardStep:
        """Launches the step's forward (the LM head on the sampled rows included) and returns
        at once; sample() finishes the step. The step before must have been sampled: its
        tokens fill this step's placeholders on the device, or on the host where a chunk's
        draft slots wait for its proposals (fill_draft_slots, then launch)."""
        return self.launch(self.fill_draft_slots(sched_out))

    @torch.inference_mode()
    def launch(self, filled: FilledStep) -> ForwardStep:
        """forward() of a step whose draft slots are filled (a TP executor sends the filled
        step to the other ranks in between)."""
        sched_out = filled.sched_out
        if sched_out.is_empty:
            self._update_requests(sched_out)
            self.block_table.update(sched_out)  # forget finished requests
            return ForwardStep(sched_out)
        inputs = prepare_inputs(sched_out, self.block_size, self.block_table)
        self._update_requests(sched_out)
        jobs = self.prompt_logprobs.plan(sched_out, inputs.chunk_start_loc, self.sampling_state)
        extra_rows = np.concatenate([job.rows for job in jobs]) if jobs else None
        pool = self.state_pool  # a hybrid model's: prefix snapshots restored, then saved
        if pool is not None:
            restore_snapshots(pool, sched_out)
        logits, prompt_hidden = self.run_model(inputs, sched_out, extra_rows)
        if pool is not None:
            save_snapshots(pool, sched_out)
        return ForwardStep(sched_out, inputs, logits, jobs, prompt_hidden, filled.row_map)

    @torch.inference_mode()
    def sample(self, step: ForwardStep, grammar: GrammarOutput | None) -> StepHandle:
        """Masks the step's logits by its grammar output (if any), samples them (verifying
        drafts) and returns the step's handle at once: result() waits for its tokens (and
        makes the host copies of its logprobs)."""
        logits, inputs = step.logits, step.inputs
        if logits is None or inputs is None:  # an empty step
            return StepHandle(self.sampling_state, [])
        if grammar is not None:
            # Applied to the forward's output before the sampler (and its logprobs) see it.
            grammar = grammar_for_step(grammar, step.row_map)
            rows = self._staging.upload({"rows": np.asarray(grammar.rows, np.int64)})["rows"]
            apply_bitmask(logits, torch.from_numpy(grammar.bitmask), rows)
        req_ids = inputs.sample_req_ids
        if inputs.num_draft_tokens is not None:
            handle: StepHandle = self._sample_drafted(logits, inputs, step.sched_out)
        else:
            sampling_meta = self.sampling_state.build_metadata(req_ids)
            sampler_out = self.sampler(logits, sampling_meta)
            self.sampling_state.record_sampled(sampling_meta, sampler_out.sampled_token_ids)
            # The next step's placeholders (async scheduling) are filled from these.
            self._last_sampled = (sampler_out.sampled_token_ids, req_ids)
            buffer = self._next_host_buffer(StepHandle.host_numel(sampler_out))
            handle = StepHandle(self.sampling_state, req_ids, sampler_out, buffer)
        if step.jobs:
            # After the sampling, so that the sampled ids' copy is not queued behind it.
            rows_per_pass = min(PROMPT_ROWS_PER_PASS, self.limits.max_num_seqs)
            packed = PromptLogprobsTracker.score(
                step.jobs, step.prompt_hidden, self.model.compute_logits, rows_per_pass
            )
            handle.prompt_logprobs_jobs = (step.jobs, packed)
        handle.pooled = self.pooling.take_results()
        if self.routed_experts is not None:
            copy = self.routed_experts.copy_step(inputs.num_tokens)
            handle.routing = (copy, inputs.slot_mapping)
        if self.drafter is not None:  # result() proposes, once the tokens are read
            handle.drafter, handle.asked = self.drafter, Drafter.asked(step.sched_out)
        # Kept only where the next step's chunks may wait for it: it had draft slots (as
        # scheduled) or asked for drafts.
        self._last_handle = handle if handle.asked or self._last_draft_slots else None
        return handle

    def _sample_drafted(
        self, logits: torch.Tensor, inputs: StepInputs, sched_out: SchedulerOutput
    ) -> DraftedStep:
        """Samples every drafted position and verifies the drafts (draft_step.py)."""
        num_draft_tokens = inputs.num_draft_tokens
        drafts = draft_token_ids(sched_out, num_draft_tokens)
        dev = self._staging.upload({"drafts": drafts, "num": num_draft_tokens})
        step = DraftedStep(
            self.sampling_state,
            self.sampler,
            logits,
            inputs.sample_req_ids,
            num_draft_tokens,
            (dev["drafts"], dev["num"]),
            self.synthetic_acceptance,
            drafts,
            self._next_host_buffer(drafts.shape[0] * (drafts.shape[1] + 2)),
        )
        self._last_sampled = (step.sampled_token_ids, inputs.sample_req_ids)
        return step

    @torch.inference_mode()
    def fill_draft_slots(self, sched_out: SchedulerOutput) -> FilledStep:
        """The step with the chunks that wait for the step before filled from its output,
        read now (a drafting request scheduled while the step that drafts for it ran:
        runner/draft_slots.py). Called once per step, before launch()."""
        prev_slots, self._last_draft_slots = self._last_draft_slots, draft_slots(sched_out)
        if not prev_slots and not any(c.num_draft_tokens for c in sched_out.chunks):
            return FilledStep(sched_out)  # the common step: nothing to fill
        if not needs_filling(sched_out, prev_slots):
            return FilledStep(sched_out)
        assert self._last_handle is not None
        filled = fill_draft_slots(sched_out, prev_slots, self._last_handle.result())
        return FilledStep(filled, True, sampled_row_map(sched_out, filled))

    def _update_requests(self, sched_out: SchedulerOutput) -> None:
        """Forgets finished requests and registers new ones in the sampling state."""
        for req_id in sched_out.finished_req_ids:
            self.sampling_state.remove(req_id)
        self.prompt_logprobs.forget(sched_out.finished_req_ids)
        self.pooling.update(sched_out)
        if self.drafter is not None:
            self.drafter.update(sched_out)
        for new in sched_out.new_requests:
            self.sampling_state.add_request(new)

    def _next_host_buffer(self, numel: int = 0) -> torch.Tensor | None:
        """The next pinned int64 buffer of the ring a step's ids (and logprobs) are copied into
        (CUDA only), of at least numel elements.

        Steps in flight at once are at most two (launched, and being applied): a ring of three
        is never overwritten before it is read. Steps allocate no pinned memory
        (cudaHostAlloc synchronizes the device), but for a step larger than any before
        (drafts, or more than 20 logprobs a row), whose slot then grows to it (a step in
        flight keeps the buffer it holds).
        """
        if self._host_ids is None:
            return None
        self._num_steps += 1
        slot = self._num_steps % len(self._host_ids)
        if self._host_ids[slot].numel() < numel:
            size = max(numel, 2 * self._host_ids[slot].numel())
            self._host_ids[slot] = torch.empty(size, dtype=torch.int64, pin_memory=True)
        return self._host_ids[slot]

    @torch.inference_mode()
    def run_model(
        self,
        inputs: StepInputs,
        sched_out: SchedulerOutput | None = None,
        extra_rows: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Runs the model over the step's tokens; returns the sampled rows' logits
        [num_sampled, vocab] and extra_rows' final hidden states [len(extra_rows), hidden] (for
        prompt logprobs; None without extra_rows)."""
        dev = self.to_device(inputs, sched_out, extra_rows)
        meta = AttnMetadata(
            query_start_loc=dev["query_start_loc"],
            seq_lens=dev["seq_lens"],
            block_tables=dev["block_tables"],
            slot_mapping=dev["slot_mapping"],
            max_seq_len=inputs.max_seq_len,
            num_decode_tokens=inputs.num_decode_tokens,
            query_start_loc_cpu=inputs.query_start_loc,
            seq_lens_cpu=inputs.seq_lens,
            decode_order=dev["decode_order"],
        )
        if self.state_spec is not None:
            meta.linear_attn = gated_delta_meta(inputs, dev)
        num_sampled = len(inputs.logits_indices)
        if (
            extra_rows is None
            and self.graphs is not None
            and self.graphs.can_replay(meta)
            and self.graphs.can_run(inputs.num_tokens, inputs.num_decode_tokens, num_sampled)
        ):
            return self.graphs.run(dev["input_ids"], dev["positions"], meta), None
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(inputs.num_tokens):
            hidden = self.mixed_graphs.run(dev["input_ids"], dev["positions"], meta)
        else:
            hidden = self.model(dev["input_ids"], dev["positions"], meta)
        if sched_out is not None and self.pooling.active:  # never a decode graph's step
            self.pooling.pool(hidden, inputs.chunk_start_loc, sched_out)
        rows = hidden[dev["logits_indices"]]  # a copy: the graphs' buffers are reused
        if extra_rows is None:
            return self.model.compute_logits(rows), None
        return self.model.compute_logits(rows[:num_sampled]), rows[num_sampled:]

    def to_device(
        self, inputs: StepInputs, sched_out: SchedulerOutput | None, extra_rows: np.ndarray | None
    ) -> dict[str, torch.Tensor]:
        """The step's inputs on the device, with placeholder tokens (sampled by the previous,
        still running step) filled in from that step's sampled ids."""
        rows = inputs.logits_indices
        if extra_rows is not None:
            rows = np.concatenate([rows, extra_rows])
        arrays = {
            "input_ids": inputs.input_ids,
            "positions": inputs.positions,
            "slot_mapping": inputs.slot_mapping,
            "logits_indices": rows.astype(np.int64, copy=False),
            "query_start_loc": inputs.query_start_loc,
            "seq_lens": inputs.seq_lens,
            "block_tables": inputs.block_tables,
            "decode_order": inputs.decode_order,
        }
        if self.state_spec is not None:
            arrays |= state_arrays(inputs, sched_out, self.num_state_slots)
        placeholder_rows = np.flatnonzero(inputs.input_ids < 0)
        if placeholder_rows.size:
            # Placeholders only stand for decode tokens, each its chunk's first (drafts follow).
            assert sched_out is not None and placeholder_rows[-1] < inputs.num_decode_tokens
            prev_sampled, prev_req_ids = self._last_sampled
            prev_row = {req_id: i for i, req_id in enumerate(prev_req_ids)}
            chunks = sched_out.chunks
            chunk_of_row = np.searchsorted(inputs.chunk_start_loc, placeholder_rows, "right") - 1
            arrays["placeholder_rows"] = placeholder_rows.astype(np.int64, copy=False)
            # Row of each placeholder's token in the previous step's sampled ids.
            arrays["prev_rows"] = np.fromiter(
                (prev_row[chunks[c].req_id] for c in chunk_of_row.tolist()),
                np.int64,
                placeholder_rows.size,
            )
        dev = self._staging.upload(arrays)
        if placeholder_rows.size:
            dev["input_ids"][dev["placeholder_rows"]] = prev_sampled[dev["prev_rows"]]
        return dev
