"""A manager for engines in lockstep (torchrun: every rank schedules) returns each request
with its compile ended, so the request is admissible from its first schedule on every rank,
a failed compile included."""

from __future__ import annotations

import pytest

from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.manager import StructuredOutputManager


def test_new_request_returns_with_its_compile_done(tiny_qwen3_dir: str) -> None:
    manager = StructuredOutputManager(tiny_qwen3_dir, 500, max_num_seqs=2, wait_for_compiles=True)
    # Specs no other test compiles: a cache hit would be done at once anyway.
    request = manager.new_request(StructuredOutputsParams(regex=r"lockstep-[0-9]{2}"))
    assert request.is_ready()  # no wait: the compile and the backend's build are done
    bitmask = manager.fill([request], [0])
    assert bitmask.shape == (1, 16)
    bad = manager.new_request(StructuredOutputsParams(regex="(lockstep"))
    with pytest.raises(ValueError, match="regex"):
        bad.is_ready()
