"""Node 0's side of the tensor-parallel ranks on other nodes (started there by `minivllm serve
--headless`, engine/executor/node_worker.py): where the ranks are, the step broadcast over gloo
(no shared memory reaches them), their failed steps and their liveness.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

from minivllm.config import EngineConfig
from minivllm.distributed.gloo_broadcast import GlooBroadcast
from minivllm.distributed.liveness import NodeMonitor, connect_store
from minivllm.engine.setup import EngineSetup


def ranks_of_node(config: EngineConfig, node: int) -> range:
    """The global ranks that run on `node`: node n holds ranks n*P .. n*P+P-1 (P ranks a node)."""
    per_node = config.tensor_parallel_size // config.nnodes
    return range(node * per_node, (node + 1) * per_node)


def remote_ranks(config: EngineConfig) -> list[int]:
    """The ranks of nodes 1..nnodes-1: the members, with rank 0, of the gloo step broadcast."""
    return list(range(len(ranks_of_node(config, 0)), config.tensor_parallel_size))


def rendezvous_address(config: EngineConfig) -> str:
    """tcp://master_addr:master_port, where every rank of every node joins the process group."""
    host = f"[{config.master_addr}]" if ":" in config.master_addr else config.master_addr
    return f"tcp://{host}:{config.master_port}"


class RemoteRanks:
    """Made by rank 0 right after it joined the process group, while the remote ranks wait for
    it (collective over rank 0 and them): sends them rank 0's EngineSetup, then watches them.
    `failure` is None while they are alive; on_failure runs once when one is lost."""

    def __init__(self, setup: EngineSetup, on_failure: Callable[[], None]) -> None:
        config = setup.config
        timeout_s = config.distributed_timeout_seconds
        ranks = remote_ranks(config)
        self._channel = GlooBroadcast.create([0, *ranks], timeout_s)
        # Every node runs what node 0 resolved (limits, dtype): they must agree step by step.
        self._channel.write(pickle.dumps(setup))
        self._keep_alive_error: str | None = None
        self._on_failure = on_failure
        store = connect_store(config.master_addr, config.master_port, timeout_s)
        nodes = {rank: rank // len(ranks_of_node(config, 0)) for rank in ranks}
        self._monitor = NodeMonitor(store, nodes, timeout_s, on_failure)

    def start_keep_alive(self) -> None:
        """Once every rank is ready (reading steps): keeps them sure that rank 0 is alive."""
        self._channel.start_keep_alive(self._keep_alive_failed)

    def _keep_alive_failed(self, error: Exception) -> None:
        self._keep_alive_error = (
            f"a rank on another node stopped receiving ({type(error).__name__}: {error})"
        )
        self._on_failure()

    @property
    def failure(self) -> str | None:
        return self._monitor.failure or self._keep_alive_error

    def check(self) -> None:
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def write(self, data: bytes) -> None:
        self._channel.write(data)

    def num_step_errors(self) -> int:
        return self._monitor.num_step_errors()

    def explain(self) -> str | None:
        """After a collective failed: which remote rank is gone (distributed/liveness.py)."""
        return self._monitor.explain()

    def close_channel(self) -> None:
        """Before the last message: no keep-alive may follow it."""
        self._channel.stop_keep_alive()

    def stop(self) -> None:
        self._channel.stop_keep_alive()
        self._monitor.stop()
