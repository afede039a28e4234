"""merge, the fan-in of a request's prompts: a prompt's outputs that come while the consumer
is busy are read as its newest only, in order, its last always; an error still ends it."""

from __future__ import annotations

import asyncio

import pytest

from minivllm.entrypoints.server.serving_common import merge


async def outputs(index: int, count: int, fail: bool = False):
    for step in range(count):
        yield (index, step)  # stands for the cumulative output after step
        await asyncio.sleep(0)
    if fail:
        raise ValueError("engine says no")


async def read(iterators, seconds_per_output: float) -> dict[int, list]:
    seen: dict[int, list] = {0: [], 1: []}
    async for index, (_, step) in merge(iterators):
        seen[index].append(step)
        await asyncio.sleep(seconds_per_output)  # a slow client: the engine runs ahead
    return seen


def test_a_slow_consumer_reads_the_newest_outputs() -> None:
    seen = asyncio.run(read([outputs(0, 50), outputs(1, 30)], 0.01))
    for index, last in [(0, 49), (1, 29)]:
        assert seen[index][-1] == last and seen[index] == sorted(set(seen[index]))
    assert len(seen[0]) + len(seen[1]) < 20  # the outputs in between were not queued


def test_an_error_ends_the_merge() -> None:
    with pytest.raises(ValueError, match="engine says no"):
        asyncio.run(read([outputs(0, 3), outputs(1, 3, fail=True)], 0.0))
