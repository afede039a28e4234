"""GPU: a step's grammar output reaches the device without waiting for the forward. The
scheduler's bitmask is a numpy view of a pinned buffer (the manager's on rank 0, the
GrammarReceiver's on a TP worker): torch must still see it as pinned, so that the runner's copy
(torch.from_numpy(...).to(device, non_blocking=True)) stays asynchronous."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.engine.executor.step_mask import GrammarReceiver
from minivllm.structured_output.bitmask import allocate_bitmask, apply_bitmask

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_the_numpy_view_of_a_pinned_bitmask_stays_pinned() -> None:
    view = allocate_bitmask(8, 1000, pin_memory=True).numpy()[:3]
    assert torch.from_numpy(view).is_pinned()
    unpinned = allocate_bitmask(8, 1000).numpy()[:3]
    assert not torch.from_numpy(unpinned).is_pinned()


def test_a_workers_received_bitmask_is_pinned_and_applies() -> None:
    words = np.zeros((2, 32), dtype=np.int32)
    words[0, 0] = 1 << 5  # row 0 allows token 5 only
    words[1, 1] = 1 << 2  # row 1 allows token 34 only
    receiver = GrammarReceiver(lambda: words.tobytes(), max_rows=4, pin_memory=True)
    grammar = receiver.receive([0, 2])
    bitmask = torch.from_numpy(grammar.bitmask)
    assert bitmask.is_pinned()
    logits = torch.randn(3, 1000, device="cuda")
    rows = torch.tensor(grammar.rows, device="cuda")
    apply_bitmask(logits, bitmask, rows)
    assert logits.argmax(dim=1)[0].item() == 5 and logits.argmax(dim=1)[2].item() == 34
