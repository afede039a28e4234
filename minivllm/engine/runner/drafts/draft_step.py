"""Sampling a step whose chunks carry draft tokens, and reading it back.

The target samples at every drafted position (a chunk with d drafts has d + 1 rows: after its
last known token and after each draft), each row keyed as that token would be without
speculation; exact verification keeps the leading drafts its own samples equal, then its own
token at the first mismatch (or after the last draft). The output is the target's, token for
token. For drafts that are certain (ngram: one-hot q), Leviathan / Chen rejection sampling
accepts draft x with probability p(x) and resamples from p without x: the law of the target's
own draw, so this one rule serves both `exact` and `rejection` (docs/speculative_decoding.md).
Synthetic acceptance (benchmarks only) keeps drafts with forced probabilities instead
(SyntheticAcceptance): then the output is not the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from minivllm.engine.runner.device_inputs import HostBufferRing, HostCopy, InputStaging
from minivllm.engine.runner.input_prep import StepInputs
from minivllm.engine.runner.sampling.logprob_packing import pack_logprobs, to_runner_logprobs
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.runner.step_handle import StepHandle
from minivllm.engine.types import RunnerOutput, SchedulerOutput
from minivllm.layers.sampler import Sampler, SamplerOutput, gather_logprobs, log_softmax_rows
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.verify import (
    VerifyOutput,
    position_rows,
    synthetic_conditional_rates,
    verify_exact,
    verify_synthetic,
)


def draft_token_ids(sched_out: SchedulerOutput, num_draft_tokens: np.ndarray) -> np.ndarray:
    """[N, K] int64 (K = the most drafts of a chunk): each sampling chunk's drafts, padded
    with -1."""
    width = int(num_draft_tokens.max())
    drafts = np.full((len(num_draft_tokens), width), -1, np.int64)
    chunks = [c for c in sched_out.chunks if c.sample]
    for row, (chunk, n) in enumerate(zip(chunks, num_draft_tokens.tolist(), strict=True)):
        if n:
            drafts[row, :n] = chunk.token_ids[-n:]
    return drafts


def sample_drafted(
    sampling_state: SamplingState,
    sampler: Sampler,
    logits: torch.Tensor,
    inputs: StepInputs,
    sched_out: SchedulerOutput,
    staging: InputStaging,
    synthetic: SyntheticAcceptance | None,
    host_buffers: HostBufferRing,
) -> DraftedStep:
    """Samples every drafted position of a step with drafts and verifies the drafts (its
    drafts go to the device through staging; its ids come back into a host_buffers one)."""
    num_draft_tokens = inputs.num_draft_tokens
    assert num_draft_tokens is not None
    drafts = draft_token_ids(sched_out, num_draft_tokens)
    dev = staging.upload({"drafts": drafts, "num": num_draft_tokens})
    return DraftedStep(
        sampling_state,
        sampler,
        logits,
        inputs.sample_req_ids,
        num_draft_tokens,
        (dev["drafts"], dev["num"]),
        synthetic,
        drafts,
        host_buffers.next(drafts.shape[0] * (drafts.shape[1] + 2)),
    )


class SyntheticAcceptance:
    """vLLM's synthetic acceptance (rejection_sample_method "synthetic", benchmarks only):
    draft j is kept with a forced probability, whatever the target samples there. The
    conditional rates are on the device, built once; the uniforms come from a generator
    seeded with the engine's seed, so every TP rank keeps the same drafts."""

    def __init__(self, rates: Sequence[float], device: torch.device, seed: int) -> None:
        """rates: the unconditional rates (SpeculativeConfig.synthetic_acceptance_rates)."""
        conditional = synthetic_conditional_rates(rates)
        self.conditional_rates = torch.tensor(conditional, dtype=torch.float32, device=device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    @classmethod
    def for_config(
        cls, spec: SpeculativeConfig | None, device: torch.device, seed: int
    ) -> SyntheticAcceptance | None:
        """The engine's synthetic acceptance; None when drafts are verified against the
        target's own draws (no speculation, "exact" or "rejection")."""
        if spec is None or spec.acceptance != "synthetic":
            return None
        assert spec.synthetic_acceptance_rates is not None  # SpeculativeConfig requires them
        return cls(spec.synthetic_acceptance_rates, device, seed)

    def verify(
        self,
        logits: torch.Tensor,
        target_token_ids: torch.Tensor,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
    ) -> VerifyOutput:
        """verify_synthetic over a step's rows. A draft whose logit is -inf (a grammar's mask
        bans it there) is rejected: every kept token is one the request may take."""
        k = draft_token_ids.shape[1]
        rows = position_rows(num_draft_tokens, k)[:, :k].clamp_(max=logits.shape[0] - 1)
        allowed = logits[rows, draft_token_ids.clamp(min=0)] > float("-inf")  # [N, K]
        return verify_synthetic(
            target_token_ids,
            draft_token_ids,
            num_draft_tokens,
            self.conditional_rates,
            self.generator,
            allowed,
        )


class DraftedStep(StepHandle):
    """A launched step with drafts: result() waits for its tokens, records them in the
    sampling state (accepted drafts and the target's token; rejected positions unsampled) and
    returns them as a RunnerOutput.

    Its accepted counts and tokens come back as a plain step's ids do (HostCopy): result()
    waits for their copy alone, not for the next step's forward queued behind it."""

    def __init__(
        self,
        sampling_state: SamplingState,
        sampler: Sampler,
        logits: torch.Tensor,
        req_ids: list[str],
        num_draft_tokens: np.ndarray,
        drafts: tuple[torch.Tensor, torch.Tensor],
        synthetic: SyntheticAcceptance | None = None,
        host_drafts: np.ndarray | None = None,
        host_buffer: torch.Tensor | None = None,
    ) -> None:
        """logits: [sum(num_draft_tokens + 1), V], each chunk's rows in order; drafts: the
        drafts [N, K] (draft_token_ids) and num_draft_tokens [N] on the logits' device;
        synthetic: verify by forced rates instead of the target's own draws; host_drafts:
        the drafts [N, K] on the host, which penalties and min_tokens count at the positions
        after them (needed when a drafting request has either); host_buffer: a pinned int64
        buffer of at least N * (K + 2) elements that the runner owns (CUDA), or None."""
        super().__init__(sampling_state, req_ids)
        self.num_draft_tokens = num_draft_tokens.tolist()
        self.row_req_ids = [
            r for r, n in zip(req_ids, self.num_draft_tokens, strict=True) for _ in range(n + 1)
        ]
        drafting = [r for r, n in zip(req_ids, self.num_draft_tokens, strict=True) if n]
        self.generator_states = sampling_state.generator_states(drafting)
        self.vocab_size = logits.shape[1]
        drafted = None  # per row, the drafts before its position
        if any(sampling_state.reads_output(r) for r in drafting):
            assert host_drafts is not None
            drafted = [
                host_drafts[i, :j].tolist()
                for i, n in enumerate(self.num_draft_tokens)
                for j in range(n + 1)
            ]
        meta = sampling_state.build_metadata(self.row_req_ids, drafted)
        self.sampler_out: SamplerOutput = sampler(logits, meta)
        target_token_ids = self.sampler_out.sampled_token_ids
        if synthetic is None:
            self.verified: VerifyOutput = verify_exact(target_token_ids, *drafts)
        else:
            self.verified = synthetic.verify(logits, target_token_ids, *drafts)
            if self.sampler_out.logprobs is not None:
                # A kept draft need not be the target's sample: score the token kept.
                self.sampler_out = _rescored(self.sampler_out, logits, self.verified, drafts[1])
        # Requests without drafts may run in the next step before this one is read (async
        # scheduling): their penalties count this token on the device now, as a plain step's
        # do. Those with drafts run in the next step only once it has read this one (their
        # draft slots wait for it: runner/drafts/draft_slots.py); result() counts their tokens.
        undrafted = [i for i, n in enumerate(self.num_draft_tokens) if not n]
        if undrafted:
            sampling_state.record_rows(
                [req_ids[i] for i in undrafted], undrafted, self.verified.output_token_ids[:, 0]
            )
        if self.sampler_out.logprobs is not None:
            self.num_logprobs = sampling_state.num_logprobs(self.row_req_ids)
            # A drafting step is read before the next is scheduled: a plain copy will do.
            self.logprobs = HostCopy(pack_logprobs(self.sampler_out), None)
        # [N, K + 2]: each chunk's accepted count, then its output tokens.
        v = self.verified
        self.rows = HostCopy(
            torch.cat([v.num_accepted[:, None], v.output_token_ids], 1), host_buffer
        )

    @property
    def sampled_token_ids(self) -> torch.Tensor:
        """[N] on the device: each chunk's last new token (the target's own)."""
        v = self.verified
        return v.output_token_ids.gather(1, v.num_accepted[:, None])[:, 0]

    @torch.inference_mode()
    def _read(self) -> RunnerOutput:
        rows = self.rows.tolist()
        out = RunnerOutput(
            req_ids=self.req_ids,
            sampled_token_ids=[],
            num_accepted_drafts=[],
            num_draft_tokens=self.num_draft_tokens,
            accepted_draft_ids=[],
        )
        state = self.sampling_state
        for req_id, n, row in zip(self.req_ids, self.num_draft_tokens, rows, strict=True):
            num_accepted, new_tokens = row[0], row[1 : row[0] + 2]
            state.append_tokens([req_id] * len(new_tokens), new_tokens)
            if self.drafter is not None:
                self.drafter.append(req_id, new_tokens)
            state.unsample(req_id, n - num_accepted)
            if req_id in self.generator_states:
                state.replay_draws(
                    req_id, self.generator_states[req_id], len(new_tokens), self.vocab_size
                )
            out.sampled_token_ids.append(new_tokens[-1])
            out.num_accepted_drafts.append(num_accepted)
            out.accepted_draft_ids.append(new_tokens[:-1])
        if self.num_logprobs is not None:
            per_row = to_runner_logprobs(self.logprobs.tolist(), self.num_logprobs)
            out.logprobs, out.draft_logprobs = [], []
            start = 0
            for n, num_accepted in zip(self.num_draft_tokens, out.num_accepted_drafts):
                out.draft_logprobs.append(per_row[start : start + num_accepted])
                out.logprobs.append(per_row[start + num_accepted])
                start += n + 1
        self.add_prompt_results(out)
        self.add_drafts(out)
        return out


def _rescored(
    sampler_out: SamplerOutput,
    logits: torch.Tensor,
    verified: VerifyOutput,
    num_draft_tokens: torch.Tensor,
) -> SamplerOutput:
    """sampler_out with each row's first logprob entry and rank for the token the step keeps
    at that row (rows past a rejection keep the sampled token's; they are dropped); the top
    logprobs are the row's either way. logits: [T, V] raw; num_draft_tokens: [N]."""
    total = logits.shape[0]
    n = num_draft_tokens.to(torch.int64) + 1
    request = torch.repeat_interleave(n, output_size=total)  # [T]: each row's request
    row_start = torch.repeat_interleave(torch.cumsum(n, 0) - n, n, output_size=total)
    position = torch.arange(total, device=n.device) - row_start  # [T], <= k_i <= K
    kept = verified.output_token_ids[request, position]
    is_kept = position <= verified.num_accepted[request]
    token_ids = torch.where(is_kept, kept, sampler_out.sampled_token_ids)
    rows = sampler_out.logprob_rows  # the rows that asked ([R]), or None: all
    if rows is not None:
        token_ids = token_ids.index_select(0, rows)
    logprobs = log_softmax_rows(logits, rows)
    ids, values, ranks = gather_logprobs(logprobs, token_ids, 0)  # [R, 1], [R, 1], [R]
    assert sampler_out.logprob_token_ids is not None and sampler_out.logprobs is not None
    return replace(
        sampler_out,
        logprob_token_ids=torch.cat([ids, sampler_out.logprob_token_ids[:, 1:]], 1),
        logprobs=torch.cat([values, sampler_out.logprobs[:, 1:]], 1),
        ranks=ranks,
    )
