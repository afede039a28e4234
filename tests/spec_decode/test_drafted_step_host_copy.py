"""A drafted step's accepted counts and tokens are read from the host buffer the runner gives
it (on CUDA a pinned copy behind the step's kernels, so that reading them does not wait for
the next step's forward): the same output as reading the device tensors."""

from __future__ import annotations

import pytest
import torch

from minivllm.engine.runner.drafts.draft_step import DraftedStep
from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import Sampler
from minivllm.sampling_params import SamplingParams

VOCAB = 16


def _step(host_buffer: torch.Tensor | None, device: str = "cpu"):
    """Two requests: "a" with drafts [3, 5] (its logits favour 3, then 9), "b" with none."""
    state = SamplingState(device)
    for req_id in "ab":
        state.add_request(NewRequestData(req_id, [1, 2], SamplingParams(temperature=0.0)))
    logits = torch.zeros(4, VOCAB, device=device)
    logits[0, 3] = logits[1, 9] = logits[2, 4] = logits[3, 7] = 1.0
    num_draft = torch.tensor([2, 0], device=device)
    drafts = torch.tensor([[3, 5], [-1, -1]], device=device)
    step = DraftedStep(
        state,
        Sampler(),
        logits,
        ["a", "b"],
        num_draft.cpu().numpy(),
        (drafts, num_draft),
        host_buffer=host_buffer,
    )
    return step, state


def test_result_is_read_from_the_host_buffer() -> None:
    buffer = torch.full((64,), -7, dtype=torch.int64)
    step, state = _step(buffer)
    out = step.result()
    # "a": 3 accepted, then the target's 9 where it drafted 5; "b": its own 7.
    assert out.num_accepted_drafts == [1, 0] and out.sampled_token_ids == [9, 7]
    assert state.requests["a"].output_token_ids == [3, 9]
    assert buffer[:8].tolist() == [1, 3, 9, -1, 0, 7, -1, -1]  # [N, K + 2]: count, tokens
    assert buffer[8:].eq(-7).all()
    reference, _ = _step(None)
    reference_out = reference.result()
    assert reference_out.num_accepted_drafts == out.num_accepted_drafts
    assert reference_out.sampled_token_ids == out.sampled_token_ids


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_result_does_not_wait_for_work_queued_after_it() -> None:
    buffer = torch.empty(64, dtype=torch.int64, pin_memory=True)
    step, _ = _step(buffer, "cuda")
    torch.cuda._sleep(2_000_000_000)  # ~1 s of device time queued behind the step
    done = torch.cuda.Event()
    done.record()
    out = step.result()
    assert not done.query()  # read before the queued work ended
    assert out.num_accepted_drafts == [1, 0] and out.sampled_token_ids == [9, 7]
    torch.cuda.synchronize()
