"""A step between the runner's two calls: ForwardStep (its forward launched, its logits not yet
sampled) and StepHandle (sampled; its ids and logprobs come to the host when the engine asks
for them: async scheduling keeps one in flight)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.engine.runner.device_inputs import HostCopy
from minivllm.engine.runner.drafts.drafter import Drafter
from minivllm.engine.runner.input_prep import StepInputs
from minivllm.engine.runner.pooling import pooled_to_host
from minivllm.engine.runner.routed_experts import step_routing
from minivllm.engine.runner.sampling.logprob_packing import pack_logprobs, to_runner_logprobs
from minivllm.engine.runner.sampling.prompt_logprobs import PromptLogprobsJob, PromptLogprobsTracker
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.layers.sampler import SamplerOutput


@dataclass
class ForwardStep:
    """A step whose forward the runner launched (ModelRunner.forward); ModelRunner.sample
    finishes it. It stays with the process that launched it (each TP rank has its own)."""

    sched_out: SchedulerOutput
    inputs: StepInputs | None = None  # None: an empty step (it only forgot finished requests)
    # [num_sampled, vocab] on the device, being computed.
    logits: torch.Tensor | None = None
    jobs: list[PromptLogprobsJob] = field(default_factory=list)
    # The final hidden states of the jobs' rows (prompt logprobs), in order.
    prompt_hidden: torch.Tensor | None = None
    # The scheduler's sampled rows -> this step's, where draft slots were left empty
    # (runner/drafts/draft_slots.py); None: the same rows.
    row_map: list[int] | None = None


class StepHandle:
    """A launched step, the runner's one return type for it (a step with drafts is a
    DraftedStep, runner/drafts/draft_step.py). result() waits for its sampled ids (copied into a
    pinned host buffer behind the step's kernels: HostCopy), records them in the sampling
    state and makes the host copies of the step's logprobs.

    Everything result() needs about the step's requests is taken at launch: under async
    scheduling a request can end (stop string, abort) while its step is in flight, and the
    next step's launch removes it from the sampling state before this step is read.
    """

    def __init__(
        self,
        sampling_state: SamplingState,
        req_ids: list[str],
        sampler_out: SamplerOutput | None = None,
        host_buffer: torch.Tensor | None = None,
    ) -> None:
        """host_buffer: a pinned 8-byte buffer that the runner owns (CUDA), of at least
        host_numel(sampler_out) elements, or None."""
        self.sampling_state = sampling_state
        self.req_ids = req_ids
        self.sampler_out = sampler_out
        # (jobs, each job's packed logprobs on the device) when the step scores prompt tokens.
        self.prompt_logprobs_jobs: tuple[list[PromptLogprobsJob], list[torch.Tensor]] | None = None
        # The pooling requests whose prompts ended this step: (req_ids, vectors or scores).
        self.pooled: list[tuple[list[str], torch.Tensor]] = []
        # enable_return_routed_experts: the step's rows on their way to the host, and the
        # rows' KV slots.
        self.routing: tuple[HostCopy, np.ndarray] | None = None
        # The runner's drafter and the (req_id, draft_cap) the step asks drafts for, when
        # the engine speculates: result() proposes after reading the step's tokens.
        self.drafter: Drafter | None = None
        self.asked: list[tuple[str, int]] = []
        # The sampled ids [num_sampled], then the packed logprobs, copied behind the step's
        # kernels: result() reads them without waiting for the next step queued after them.
        self.ids: HostCopy | None = None
        self.logprobs: HostCopy | None = None
        self.num_logprobs: list[int | None] | None = None
        self._result: RunnerOutput | None = None
        if sampler_out is None:
            return
        ids = sampler_out.sampled_token_ids
        self.ids = HostCopy(ids, None if host_buffer is None else host_buffer[: ids.numel()])
        if sampler_out.logprobs is not None:
            self.num_logprobs = sampling_state.num_logprobs(req_ids)
            rest = None if host_buffer is None else host_buffer[ids.numel() :]
            self.logprobs = HostCopy(pack_logprobs(sampler_out), rest)

    @staticmethod
    def host_numel(sampler_out: SamplerOutput) -> int:
        """The host buffer's elements a step with sampler_out needs: ids, packed logprobs."""
        ids = sampler_out.sampled_token_ids.numel()
        if sampler_out.logprobs is None:
            return ids
        rows, width = sampler_out.logprobs.shape
        return ids + rows * (2 * width + 1)

    def result(self) -> RunnerOutput:
        """The step's RunnerOutput, read once: the runner may read it first, when the next
        step's draft slots wait for it (runner/drafts/draft_slots.py), and the scheduler again."""
        if self._result is None:
            self._result = self._read()
        return self._result

    @torch.inference_mode()
    def _read(self) -> RunnerOutput:
        token_ids = [] if self.ids is None else self.ids.tolist()
        self.sampling_state.append_tokens(self.req_ids, token_ids)
        out = RunnerOutput(req_ids=self.req_ids, sampled_token_ids=token_ids)
        if self.logprobs is not None:
            out.logprobs = to_runner_logprobs(self.logprobs.tolist(), self.num_logprobs)
        self.add_prompt_results(out)
        if self.drafter is not None:
            self.drafter.append_sampled(self.req_ids, token_ids)
            self.add_drafts(out)
        return out

    def add_drafts(self, out: RunnerOutput) -> None:
        """The next step's drafts of the asked requests, proposed now that the drafter's
        histories hold this step's tokens."""
        if self.drafter is not None and self.asked:
            out.draft_token_ids = self.drafter.propose(self.asked)

    def add_prompt_results(self, out: RunnerOutput) -> None:
        """What the step read from its token rows: prompt logprobs, pooled vectors, routed
        experts."""
        if self.prompt_logprobs_jobs is not None:
            out.prompt_logprobs = PromptLogprobsTracker.collect(*self.prompt_logprobs_jobs)
        if self.pooled:
            out.pooled = pooled_to_host(self.pooled)
        if self.routing is not None:
            out.routed_experts = step_routing(*self.routing)
