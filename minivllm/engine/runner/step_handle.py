"""StepHandle: a step the runner launched, whose sampled ids and logprobs come to the host
when the engine asks for them (async scheduling keeps one in flight)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minivllm.engine.runner.device_inputs import HostCopy
from minivllm.engine.runner.draft_step import DraftedStep
from minivllm.engine.runner.prompt_logprobs import PromptLogprobsJob, PromptLogprobsTracker
from minivllm.engine.runner.sampling_state import SamplingState, to_runner_logprobs
from minivllm.engine.types import RunnerOutput
from minivllm.layers.sampler import SamplerOutput


class StepHandle:
    """A launched step. result() waits for its sampled ids (copied into a pinned host buffer
    behind the step's kernels: HostCopy), records them in the sampling state and makes the
    host copies of the step's logprobs.

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
        self.sampling_state = sampling_state
        self.req_ids = req_ids
        self.sampler_out = sampler_out
        self.num_logprobs: list[int | None] | None = None
        if sampler_out is not None and sampler_out.logprobs is not None:
            self.num_logprobs = sampling_state.num_logprobs(req_ids)
        # (jobs, their logits [rows, vocab]) when the step scores prompt tokens.
        self.prompt_logprobs_jobs: tuple[list[PromptLogprobsJob], torch.Tensor] | None = None
        # [num_sampled] into a pinned buffer that the runner owns (CUDA); none when no row
        # was sampled.
        ids = None if sampler_out is None else sampler_out.sampled_token_ids
        self.ids = None if ids is None else HostCopy(ids, host_buffer)

    @torch.inference_mode()
    def result(self) -> RunnerOutput:
        token_ids = [] if self.ids is None else self.ids.tolist()
        self.sampling_state.append_tokens(self.req_ids, token_ids)
        out = RunnerOutput(req_ids=self.req_ids, sampled_token_ids=token_ids)
        if self.num_logprobs is not None:
            out.logprobs = to_runner_logprobs(self.sampler_out, self.num_logprobs)
        if self.prompt_logprobs_jobs is not None:
            out.prompt_logprobs = PromptLogprobsTracker.collect(*self.prompt_logprobs_jobs)
        return out


class DeferredSampling:
    """A constrained step whose forward is launched and whose mask and sampling wait: under
    async scheduling the runner launches them just before the next step's forward, once the
    scheduler has applied the step before this one (its tokens advance the matchers) and
    scheduled the next. The host's work of a step then overlaps this step's forward instead
    of leaving the device idle between the sampling and the next forward.

    sample: fills the mask, applies it and launches the sampling; it runs once, at the
    runner's next launch or at result(), whichever comes first.
    """

    def __init__(self, sample: Callable[[], StepHandle | DraftedStep]) -> None:
        self._sample: Callable[[], StepHandle | DraftedStep] | None = sample
        self._handle: StepHandle | DraftedStep | None = None

    def launch(self) -> StepHandle | DraftedStep:
        """Launches the sampling (once) and returns the step's handle."""
        if self._handle is None:
            sample, self._sample = self._sample, None
            if sample is None:
                raise RuntimeError("the sampling of this step failed at its launch")
            self._handle = sample()
        return self._handle

    def result(self) -> RunnerOutput:
        return self.launch().result()
