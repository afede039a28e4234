"""The CUDA sampling path of non-plain batches draws with the fused kernel's keyed noise
(through Triton's interpreter on a CPU, on the GPU where there is one): a row without filters
gets exactly the token a plain batch gives it, and a filtered row never leaves its support."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from minivllm.kernels.sampling import sample_plain
from minivllm.layers.sampler import Sampler

# The kernel takes tensors on the device Triton runs on: the GPU, else the interpreter's CPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_unfiltered_row_draws_like_a_plain_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 64, device=DEVICE)
    temperature = torch.tensor([0.7, 1.0, 0.0], device=DEVICE)
    seeds = torch.tensor([11, 22, 33], device=DEVICE)
    offsets = torch.tensor([5 << 32, 0, 0], device=DEVICE)
    meta = SimpleNamespace(temperature=temperature, seeds=seeds, offsets=offsets)
    # Row 1 is filtered (top-k style: half its tokens dropped); rows 0 and 2 are not.
    filtered = logits / torch.where(temperature == 0, 1.0, temperature).unsqueeze(1)
    dropped = torch.zeros_like(filtered, dtype=torch.bool)
    dropped[1, logits[1].argsort()[:32]] = True
    filtered = filtered.masked_fill(dropped, -torch.inf)
    drawn = Sampler(use_triton=True).draw_kept(
        logits.masked_fill(filtered == -torch.inf, -torch.inf), meta
    )
    plain = sample_plain(logits, temperature, seeds, offsets)
    assert drawn[0] == plain[0] and drawn[2] == plain[2] == logits[2].argmax()
    assert not dropped[1, drawn[1]]


def test_filtered_rows_stay_in_support() -> None:
    torch.manual_seed(1)
    logits = torch.randn(1, 16, device=DEVICE).repeat(200, 1)
    keep = torch.zeros(16, dtype=torch.bool, device=DEVICE)
    keep[[2, 5, 7]] = True
    filtered = logits.masked_fill(~keep, -torch.inf)
    meta = SimpleNamespace(
        temperature=torch.ones(200, device=DEVICE),
        seeds=torch.arange(200, dtype=torch.int64, device=DEVICE),
        offsets=torch.zeros(200, dtype=torch.int64, device=DEVICE),
    )
    drawn = Sampler(use_triton=True).draw_kept(
        logits.masked_fill(filtered == -torch.inf, -torch.inf), meta
    )
    assert set(drawn.tolist()) <= {2, 5, 7}
    assert len(set(drawn.tolist())) == 3
