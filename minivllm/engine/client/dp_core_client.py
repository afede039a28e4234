"""DPCoreClient: an EngineClient over data_parallel_size engine-core processes
(replicas, each on its own tensor_parallel_size GPUs); new requests go to the replica with
the fewest outstanding tokens (LoadBalancer). Used by DPEngine (LLM) and AsyncLLM (server)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import fields, replace

from minivllm.config import EngineConfig
from minivllm.engine.client.core_client import EngineCoreClient
from minivllm.engine.client.load_balancer import LoadBalancer
from minivllm.engine.client.protocol import MessageKind
from minivllm.engine.stats import EngineStats
from minivllm.engine.types import EngineRequest
from minivllm.models.model_config import ModelConfig
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.params import StructuredOutputSpec


def replica_env(config: EngineConfig, index: int) -> dict[str, str]:
    """The environment of replica `index`: its own tensor_parallel_size GPUs (of the ones
    this process sees), and this very minivllm on the import path."""
    env = dict(os.environ)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if config.resolved_device().type == "cuda":
        import torch

        visible = env.get("CUDA_VISIBLE_DEVICES")
        count = torch.cuda.device_count()
        devices = visible.split(",") if visible else [str(i) for i in range(count)]
        tp = config.tensor_parallel_size
        needed = config.data_parallel_size * tp
        if len(devices) < needed:
            raise ValueError(
                f"data_parallel_size x tensor_parallel_size = {needed} GPUs, but only "
                f"{len(devices)} are visible"
            )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[index * tp : (index + 1) * tp])
    return env


class DPCoreClient:
    """Owns N EngineCoreClients. Their reader threads call on_message with the replica's
    messages after the balancer has seen them: outputs of open requests only, with the
    stats summed over replicas; one (DEAD, reason) when any replica dies."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        on_message: Callable[[tuple], None],
    ) -> None:
        self._on_message = on_message
        self._lock = threading.Lock()  # the balancer: reader threads vs add/abort callers
        self._dead = False
        size = config.data_parallel_size
        self._stats = [EngineStats() for _ in range(size)]
        envs = [replica_env(config, i) for i in range(size)]
        replica_config = replace(config, data_parallel_size=1)
        # Replicas start side by side (model load, KV profiling, graph capture).
        with ThreadPoolExecutor(size) as pool:
            futures = [
                pool.submit(
                    EngineCoreClient, replica_config, model_config, self._handler(i), env=env
                )
                for i, env in enumerate(envs)
            ]
        errors = [f.exception() for f in futures if f.exception() is not None]
        self.replicas: list[EngineCoreClient] = [f.result() for f in futures if not f.exception()]
        self._finalizer = weakref.finalize(self, _shutdown_replicas, self.replicas)
        if errors:
            self.shutdown()
            raise errors[0]
        first = self.replicas[0].info
        num_blocks = min(r.info.num_blocks for r in self.replicas)
        self.info = replace(first, num_blocks=num_blocks)  # pid: replica 0's
        # Requests (and so outputs) come only after this: the reader threads need it then.
        self.balancer = LoadBalancer(size, self.info.max_model_len)

    def add_requests(self, requests: list[EngineRequest]) -> None:
        by_replica: dict[int, list[EngineRequest]] = {}
        with self._lock:
            for request in requests:
                index = self.balancer.assign(
                    request.req_id,
                    len(request.prompt_token_ids),
                    request.sampling_params.max_tokens,
                )
                by_replica.setdefault(index, []).append(request)
        for index, batch in by_replica.items():
            self.replicas[index].add_requests(batch)

    def abort_requests(self, req_ids: list[str]) -> None:
        if not req_ids:
            return
        with self._lock:
            by_replica = self.balancer.split_by_replica(req_ids)
        for index, ids in by_replica.items():
            self.replicas[index].abort_requests(ids)

    def check_grammar(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CheckOutcome]:
        """Checked by the replica that would take a request now (the least loaded); the
        request may go to another one, which then compiles the spec too."""
        with self._lock:
            index = self.balancer.least_loaded()
        return self.replicas[index].check_grammar(spec, refuse_when_busy)

    def shutdown(self) -> None:
        """Stops every replica (side by side); idempotent."""
        self._finalizer()

    # ---- internals ------------------------------------------------------------------------

    def _handler(self, index: int) -> Callable[[tuple], None]:
        return lambda msg: self._on_replica_message(index, msg)

    def _on_replica_message(self, index: int, msg: tuple) -> None:
        kind = msg[0]
        with self._lock:
            if kind is MessageKind.OUTPUTS:
                self._stats[index] = msg[2]
                outputs = self.balancer.update(index, msg[1])
                msg = (MessageKind.OUTPUTS, outputs, _sum_stats(self._stats))
            elif kind is MessageKind.REJECTED:
                self.balancer.forget(msg[1])
            elif kind is MessageKind.DEAD:
                if self._dead:
                    return
                self._dead = True
                msg = (MessageKind.DEAD, f"data-parallel replica {index}: {msg[1]}")
        self._on_message(msg)


def _sum_stats(stats: list[EngineStats]) -> EngineStats:
    """The replicas' stats as one engine's: counts add up (per-position lists position by
    position), the cache usage is the mean (replicas have equal caches, up to profiling
    noise)."""
    names = [f.name for f in fields(EngineStats)]
    total = EngineStats(**{name: _add(getattr(s, name) for s in stats) for name in names})
    total.kv_cache_usage = total.kv_cache_usage / len(stats)
    return total


def _add(values):
    """The sum of numbers, or of equal-length lists element by element."""
    values = list(values)
    if isinstance(values[0], list):
        return [sum(column) for column in zip(*values, strict=True)]
    return sum(values)


def _shutdown_replicas(replicas: list[EngineCoreClient]) -> None:
    """Stops every replica, side by side. A weakref finalizer: it also runs at interpreter
    exit, while the clients' threads still run (a __del__ during teardown may be too late)."""
    threads = [threading.Thread(target=replica.shutdown) for replica in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
