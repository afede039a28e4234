"""ModelRunner: owns the model, the KV cache and the sampler on one device (one TP rank).

Its interface to the engine core, one step in two calls: `forward(SchedulerOutput) ->
ForwardStep` launches the forward, `sample(ForwardStep, GrammarOutput | None) -> StepHandle`
masks and samples its logits; the handle's result() waits for the tokens. Built once: the
model (model_setup.py), the KV cache sized by a memory profile (cache/profiling.py), then the
CUDA graphs (graphs/graph_capture.py).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from minivllm.attention.base import AttnMetadata
from minivllm.engine.runner.block_table import BlockTable
from minivllm.engine.runner.cache.kv_cache import KVCacheSpec, bind_kv_caches
from minivllm.engine.runner.cache.profiling import (
    memory_baseline,
    profile_kv_budget,
    sample_worst_case,
)
from minivllm.engine.runner.cache.state_budget import blocks_for_budget, state_budget_for
from minivllm.engine.runner.cache.state_cache import (
    RecurrentStatePool,
    RecurrentStateSpec,
    bind_recurrent_states,
)
from minivllm.engine.runner.device_inputs import HostBufferRing, InputStaging
from minivllm.engine.runner.drafts.draft_slots import DraftSlotFiller, FilledStep, grammar_for_step
from minivllm.engine.runner.drafts.draft_step import SyntheticAcceptance, sample_drafted
from minivllm.engine.runner.drafts.drafter import Drafter
from minivllm.engine.runner.graphs.cuda_graph import CUDAGraphRunner
from minivllm.engine.runner.graphs.graph_capture import GraphCapture, compile_masking_and_filters
from minivllm.engine.runner.graphs.piecewise_graph import PiecewiseGraphRunner
from minivllm.engine.runner.hybrid_inputs import (
    gated_delta_meta,
    restore_snapshots,
    save_snapshots,
)
from minivllm.engine.runner.input_prep import StepInputs, prepare_inputs
from minivllm.engine.runner.model_setup import load_model, routed_experts_capture
from minivllm.engine.runner.pooling import PoolingRunner, pooling_reserve_bytes
from minivllm.engine.runner.sampling.prompt_logprobs import (
    PROMPT_ROWS_PER_PASS,
    PromptLogprobsTracker,
)
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.runner.step_handle import ForwardStep, StepHandle
from minivllm.engine.runner.step_upload import LastSampled, upload_step
from minivllm.engine.setup import EngineSetup
from minivllm.engine.types import GrammarOutput, RunnerOutput, SchedulerOutput
from minivllm.layers.dispatch import use_triton_kernels
from minivllm.layers.sampler import Sampler
from minivllm.spec_decode.proposer import Proposer
from minivllm.structured_output.bitmask import apply_bitmask

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, setup: EngineSetup, device: torch.device) -> None:
        """device: this rank's device (setup.device, with the rank's index under TP)."""
        config = self.config = setup.config
        model_config = setup.model_config
        self.setup = setup
        self.device = device
        self.max_model_len = max_model_len = setup.max_model_len
        self.tp_size = tp_size = config.tensor_parallel_size
        self.block_size = config.block_size
        self.limits = setup.limits
        max_num_seqs = self.limits.max_num_seqs
        self.memory_baseline = 0
        if device.type == "cuda":  # before this engine allocates anything
            self.memory_baseline = memory_baseline(device, config.gpu_memory_utilization)
        self.model, self.attn_backend = load_model(setup, device)
        # Static buffers and per-request tables before the memory profile, which counts them.
        self.routed_experts = routed_experts_capture(setup, self.model, device)
        self.sampler = Sampler(use_triton_kernels(device))
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
        self.state_spec = RecurrentStateSpec.for_model(model_config, setup.dtype, device, tp_size)
        # Hybrid models: the recurrent-state pool (running requests' slots, then snapshots').
        self.state_pool: RecurrentStatePool | None = None
        self.num_state_slots = 0  # the pool's slots for running requests
        if self.state_spec is not None:
            self._bind_state_pool(1, 1)  # for the memory profile's trial step; sized with the KV
        self.graph_capture = GraphCapture(
            setup, self.model, self.attn_backend, device, hybrid=self.state_spec is not None
        )
        self.graphs: CUDAGraphRunner | None = None  # once captured
        self.mixed_graphs: PiecewiseGraphRunner | None = None  # likewise
        self.graph_bytes = 0  # the memory the captured CUDA graphs hold, once captured
        # The last step's sampled ids: the next step's placeholders are filled from them.
        self._last_sampled: LastSampled | None = None
        # What a step's chunks may wait for: the step before (async scheduling with drafts).
        self._draft_slots = DraftSlotFiller()
        self._host_buffers = HostBufferRing(device, max_num_seqs)
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
            None if self.config.enforce_eager else self.graph_capture.largest,
        )
        return blocks_for_budget(self.setup, budget)

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
        if self.device.type == "cuda" and not self.config.enforce_eager:
            self.graphs, self.mixed_graphs, self.graph_bytes = self.graph_capture.capture()
        if self.device.type == "cuda":
            compile_masking_and_filters(self.model, self.sampler, self.device)

    def attach_proposer(self, proposer: Proposer) -> None:
        """Speculative decoding: after each step, `proposer` drafts the next step's tokens
        of the chunks that ask (runner/drafts/drafter.py). Rank 0's runner only: its RunnerOutput
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
        if inputs.num_draft_tokens is not None:  # verifies the drafts (drafts/draft_step.py)
            drafted = sample_drafted(
                self.sampling_state,
                self.sampler,
                logits,
                inputs,
                step.sched_out,
                self._staging,
                self.synthetic_acceptance,
                self._host_buffers,
            )
            self._last_sampled = (drafted.sampled_token_ids, req_ids)
            handle: StepHandle = drafted
        else:
            sampling_meta = self.sampling_state.build_metadata(req_ids)
            sampler_out = self.sampler(logits, sampling_meta)
            self.sampling_state.record_sampled(sampling_meta, sampler_out.sampled_token_ids)
            # The next step's placeholders (async scheduling) are filled from these.
            self._last_sampled = (sampler_out.sampled_token_ids, req_ids)
            buffer = self._host_buffers.next(StepHandle.host_numel(sampler_out))
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
        self._draft_slots.sampled(handle)
        return handle

    @torch.inference_mode()
    def fill_draft_slots(self, sched_out: SchedulerOutput) -> FilledStep:
        """The step with the chunks that wait for the step before filled from its output,
        read now (a drafting request scheduled while the step that drafts for it ran:
        runner/drafts/draft_slots.py). Called once per step, before launch()."""
        return self._draft_slots.fill(sched_out)

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
        num_state_slots = None if self.state_spec is None else self.num_state_slots
        dev = upload_step(
            self._staging, inputs, sched_out, extra_rows, num_state_slots, self._last_sampled
        )
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
