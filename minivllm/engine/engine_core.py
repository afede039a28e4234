"""EngineCore: tokens in, tokens out. step() is schedule, forward, grammar masks, sample,
update.

Both frontends (LLM.generate and the server's AsyncLLM) drive this one class. It resolves
the configuration once (engine/setup.py) and hands that EngineSetup down.
"""

from __future__ import annotations

import gc
import logging
import os
from concurrent.futures import Future

from minivllm.config import EngineConfig
from minivllm.cpu_threads import set_torch_threads
from minivllm.engine.executor.build import build_executor
from minivllm.engine.executor.torchrun import torchrun_rank
from minivllm.engine.runner.cache.state_budget import state_budget_for
from minivllm.engine.sched.async_scheduler import AsyncScheduler
from minivllm.engine.sched.kv.kv_coordinator import make_kv_coordinator
from minivllm.engine.sched.request import Request
from minivllm.engine.sched.routed_experts import RoutedExpertsRecorder
from minivllm.engine.sched.scheduler import Scheduler
from minivllm.engine.sched.speculation import Speculator
from minivllm.engine.setup import resolve_setup
from minivllm.engine.stats import CoreInfo, EngineStats
from minivllm.engine.types import EngineOutput, EngineRequest, SchedulerOutput
from minivllm.engine.warm_up import warm_up
from minivllm.kernels.late_compiles import engine_starting, log_late_compiles
from minivllm.models.model_config import ModelConfig
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.structured_output.params import StructuredOutputSpec

logger = logging.getLogger(__name__)

# The longest an idle step waits for a grammar compile before it returns: new requests and
# aborts are read between steps.
IDLE_GRAMMAR_WAIT_S = 0.02


class EngineCore:
    """One engine replica in this process: an EngineClient (engine/client/protocol.py) that
    the caller steps."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig) -> None:
        """model_config: the model's, as the caller read it (once per process)."""
        if config.data_parallel_size != 1:
            # One core is one replica; dp_core_client.DPCoreClient runs several.
            raise ValueError(
                f"data_parallel_size={config.data_parallel_size}: an engine core is one "
                "replica (LLM and AsyncLLM run several through DPCoreClient)"
            )
        self.setup = setup = resolve_setup(config, model_config)
        logger.info(
            "scheduler limits (%s): max_num_seqs=%d, max_num_batched_tokens=%d",
            config.usage_context,
            *setup.limits,
        )
        on_cuda = setup.device.type == "cuda"
        if setup.device.type == "cpu":  # torch's thread counts, from the usable cores
            set_torch_threads("engine")
        # Grammars of constrained requests, over the tokenizer the frontend uses (loaded in
        # the core's process at the first such request; a server's core builds it once started).
        self.structured_outputs = StructuredOutputManager(
            config.resolved_tokenizer(),
            model_config.vocab_size,
            setup.limits.max_num_seqs,
            pin_memory=on_cuda,
            # Under torchrun every rank schedules: admission must not hang on compile timing.
            wait_for_compiles=torchrun_rank() is not None,
            cache_bytes=config.grammar_cache_bytes,
        )
        with engine_starting():  # its compiles are expected, not late (kernels/late_compiles)
            self.executor = build_executor(setup)
            self.num_blocks = self.executor.num_blocks
            # What a frontend needs to validate requests without the engine at hand.
            self.info = CoreInfo(
                max_model_len=setup.max_model_len,
                vocab_size=model_config.vocab_size,
                num_blocks=self.num_blocks,
                block_size=config.block_size,
                pid=os.getpid(),
            )
            if self.num_blocks < 1:
                raise ValueError(
                    "no KV cache blocks fit in the memory budget; raise gpu_memory_utilization "
                    "(CUDA) or kv_cache_memory (CPU), or lower max_num_batched_tokens"
                )
            logger.info(
                "KV cache: %d blocks of %d tokens (%d tokens)",
                self.num_blocks,
                config.block_size,
                self.num_blocks * config.block_size,
            )
            # Under TP every rank samples the same ids and fills placeholders from its own copy.
            # A hybrid model that speculates steps synchronously: its draft-state slots are
            # taken per draft when a step is scheduled, so the drafts must be known by then.
            hybrid_drafts = (
                model_config.linear_attention is not None and config.speculative_config is not None
            )
            self.async_scheduling = config.async_scheduling and not hybrid_drafts
            if on_cuda:
                steps = warm_up(
                    self.new_scheduler(),
                    self.run_step,
                    model_config.vocab_size,
                    setup.max_model_len,
                    kv_capacity=self.num_blocks * config.block_size,
                )
                logger.info("warm-up: %d steps", steps)
        if on_cuda:
            log_late_compiles(logger)  # imports triton: CUDA only
        self.scheduler = self.new_scheduler()
        if self.scheduler.routed_experts is not None:
            logger.info(
                "routed experts: %.1f MiB of host memory (one row per KV slot)",
                self.scheduler.routed_experts.nbytes / 2**20,
            )
        # What exists now (torch, the model, the tokenizer: ~200k objects) lives as long as the
        # engine. Frozen, the cyclic GC stops walking it: walking it made full collections a
        # per-step cost at large batch (measured: docs/performance.md). shutdown()
        # unfreezes, so that a dropped engine's cycles can be collected (vLLM does the same).
        gc.collect()
        gc.freeze()
        if config.usage_context == "server":
            self.structured_outputs.prebuild()
        self.is_shut_down = False

    def new_scheduler(self) -> Scheduler:
        """A scheduler over an empty KV cache. Async scheduling is a Scheduler that keeps the
        launched step in flight (its update() does not wait for the step's tokens); step()
        reads the same either way."""
        scheduler_class = AsyncScheduler if self.async_scheduling else Scheduler
        setup, config = self.setup, self.setup.config
        states = state_budget_for(setup, self.num_blocks)
        return scheduler_class(
            max_num_seqs=setup.limits.max_num_seqs,
            max_num_batched_tokens=setup.limits.max_num_batched_tokens,
            max_model_len=setup.max_model_len,
            block_manager=make_kv_coordinator(
                self.num_blocks,
                config.block_size,
                config.enable_prefix_caching,
                states.num_state_slots,
                states.num_snapshot_slots,
                states.snapshot_interval,
                states.num_draft_state_slots,
            ),
            structured_outputs=self.structured_outputs,
            policy=config.scheduling_policy,
            speculator=(
                None
                if config.speculative_config is None
                else Speculator(config.speculative_config, setup.max_model_len)
            ),
            routed_experts=(
                None
                if setup.routed_experts is None
                else RoutedExpertsRecorder(setup.routed_experts, self.num_blocks, config.block_size)
            ),
        )

    def add_requests(self, requests: list[EngineRequest]) -> None:
        """Queues requests its frontend has validated (request_checks.check_request).
        ValueError for an id in use (a finished request's id is free after the next step);
        RuntimeError after shutdown()."""
        if self.is_shut_down:
            raise RuntimeError("the engine was shut down: it takes no requests (start a new one)")
        for r in requests:
            request = Request(
                r.req_id,
                r.prompt_token_ids,
                r.sampling_params,
                r.arrival_time,
                r.cache_salt,
                r.priority,
            )
            self.scheduler.add_request(request)

    def abort_requests(self, req_ids: list[str]) -> None:
        self.scheduler.abort_requests(req_ids)

    def check_grammar(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CheckOutcome]:
        """A frontend's check of a constrained request's spec before it adds the request: the
        spec compiles here, once (the request's compile is then a cache hit)."""
        return self.structured_outputs.check(spec, refuse_when_busy)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def stats(self) -> EngineStats:
        """A snapshot of load and counters; cheap enough to call every step."""
        scheduler = self.scheduler
        block_manager = scheduler.block_manager
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_cache_usage=block_manager.usage,
            num_free_blocks=block_manager.num_free_blocks,
            num_preemptions=scheduler.num_preemptions,
            prefix_cache_queries=scheduler.prefix_cache_queries,
            prefix_cache_hits=scheduler.prefix_cache_hits,
            **_spec_stats(scheduler),
        )

    def step(self) -> list[EngineOutput]:
        """Schedules, runs and applies one step. With async scheduling, update() keeps the
        step in flight and applies the step before it (AsyncScheduler), so that the host work
        of one step overlaps the device work of the other."""
        sched_out, outputs = self.run_step(self.scheduler)
        if sched_out.is_empty and not outputs:  # idle: nothing runs until a grammar compiles
            self.scheduler.wait_for_grammars(IDLE_GRAMMAR_WAIT_S)
        return outputs

    def run_step(self, scheduler: Scheduler) -> tuple[SchedulerOutput, list[EngineOutput]]:
        """One step of `scheduler` (the engine's, or the warm-up's)."""
        scheduler.catch_up()  # async: the step in flight first, where the next needs its tokens
        sched_out = scheduler.schedule()
        forward = self.executor.forward(sched_out)  # launched: the device runs it from here
        grammar = scheduler.grammar_output(sched_out)  # meanwhile, the masks on the host
        step = self.executor.sample(forward, grammar)
        outputs = scheduler.update(sched_out, step)
        return sched_out, outputs

    def shutdown(self) -> None:
        """Stops the executor, which lets go of the model, the KV cache and the graphs: their
        device memory goes back once this process collects (the next engine's start does)."""
        self.is_shut_down = True
        self.executor.shutdown()
        gc.unfreeze()


def _spec_stats(scheduler: Scheduler) -> dict:
    """The EngineStats fields of the scheduler's speculation counters (none: zeros)."""
    if scheduler.speculator is None:
        return {}
    spec = scheduler.speculator.stats
    return {
        "spec_num_drafts": spec.num_drafts,
        "spec_num_draft_tokens": spec.num_draft_tokens,
        "spec_num_accepted_tokens": spec.num_accepted_tokens,
        "spec_accepted_per_pos": list(spec.num_accepted_tokens_per_pos),
    }
