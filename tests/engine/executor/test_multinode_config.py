"""The multi-node options are checked before anything loads: a clear ValueError for each bad
combination, at LLM(...) and at `minivllm serve --headless`."""

from __future__ import annotations

import re

import pytest

from minivllm.config import EngineConfig
from minivllm.engine.executor.remote_ranks import ranks_of_node, remote_ranks, rendezvous_address
from minivllm.entrypoints.cli import main


@pytest.mark.parametrize(
    "options, message",
    [
        ({"nnodes": 0}, "nnodes must be >= 1"),
        (
            {"nnodes": 2, "node_rank": 2, "tensor_parallel_size": 2},
            "node_rank must be in [0, nnodes=2), got 2",
        ),
        ({"node_rank": -1}, "node_rank must be in"),
        ({"nnodes": 2, "tensor_parallel_size": 3}, "must be a multiple of nnodes"),
        (
            {"nnodes": 2, "tensor_parallel_size": 2, "data_parallel_size": 2},
            "data_parallel_size > 1 with nnodes > 1",
        ),
        ({"master_port": 0}, "master_port must be in [1, 65535]"),
        ({"master_addr": ""}, "master_addr must be"),
        ({"distributed_timeout_seconds": 0}, "distributed_timeout_seconds must be >= 1"),
    ],
)
def test_bad_multinode_options(tiny_qwen3_dir: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineConfig.from_options(tiny_qwen3_dir, **options)


def test_ranks_of_the_nodes(tiny_qwen3_dir: str) -> None:
    config = EngineConfig.from_options(
        tiny_qwen3_dir, tensor_parallel_size=8, nnodes=2, master_addr="10.0.0.1", master_port=7
    )
    assert list(ranks_of_node(config, 0)) == [0, 1, 2, 3]
    assert list(ranks_of_node(config, 1)) == [4, 5, 6, 7]
    assert remote_ranks(config) == [4, 5, 6, 7]
    assert rendezvous_address(config) == "tcp://10.0.0.1:7"
    ipv6 = EngineConfig.from_options(tiny_qwen3_dir, master_addr="fe80::1", master_port=7)
    assert rendezvous_address(ipv6) == "tcp://[fe80::1]:7"


@pytest.mark.parametrize("flags", [[], ["--nnodes", "2", "--tensor-parallel-size", "2"]])
def test_headless_needs_another_node(tiny_qwen3_dir: str, flags: list, capsys) -> None:
    """--headless on node 0 (or without --nnodes): exit 2 and a line saying what to give."""
    assert main(["serve", tiny_qwen3_dir, "--headless", "--device", "cpu", *flags]) == 2
    assert "--node-rank >= 1" in capsys.readouterr().err
