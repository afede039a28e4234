"""StepHandle: a step's sampled ids and logprobs come back through one host buffer (the
runner's pinned ring on CUDA), the same as read straight from the device."""

from __future__ import annotations

import torch

from minivllm.engine.runner.sampling.sampling_state import SamplingState
from minivllm.engine.runner.step_handle import StepHandle
from minivllm.engine.types import NewRequestData
from minivllm.layers.sampler import Sampler
from minivllm.sampling_params import SamplingParams


def _step(buffer: torch.Tensor | None):
    state = SamplingState("cpu")
    options = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.0)]
    for i, params in enumerate(options):
        state.add_request(NewRequestData(f"r{i}", [1, 2], params))
    torch.manual_seed(0)
    logits = torch.randn(2, 40)
    out = Sampler()(logits, state.build_metadata(["r0", "r1"]))
    return StepHandle(state, ["r0", "r1"], out, buffer), out, logits


def test_ids_and_logprobs_through_one_buffer_equal_the_direct_read():
    direct, out, logits = _step(None)
    numel = StepHandle.host_numel(out)
    # ids, then [R, 2(k+1)+1] packed logprobs: only the row that asked comes to the host
    assert numel == 2 + 1 * (2 * 4 + 1)
    buffer = torch.full((numel + 5,), -7, dtype=torch.int64)
    through, _, _ = _step(buffer)
    expected, got = direct.result(), through.result()
    assert got.sampled_token_ids == expected.sampled_token_ids == logits.argmax(1).tolist()
    assert got.logprobs == expected.logprobs
    assert got.logprobs[1] is None and len(got.logprobs[0]) == 3  # greedy: top-1
    raw = torch.log_softmax(logits, dim=-1)
    top = raw[0].argsort(descending=True)[:3].tolist()
    assert list(got.logprobs[0]) == top
    assert got.logprobs[0][top[1]].logprob == raw[0, top[1]].item()
    assert buffer[numel:].tolist() == [-7] * 5  # nothing written past what it needs
