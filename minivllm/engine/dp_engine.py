"""Data parallelism: N engine replicas, each an EngineCore in its own process (its own
scheduler, KV cache and tensor_parallel_size GPUs), behind one EngineCore-like frontend.

A new request goes to the replica with the fewest outstanding tokens (prompt plus tokens
still to generate, of the requests it holds). `make_engine` picks this or a plain EngineCore.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import minivllm
from minivllm.config import EngineConfig, ModelConfig
from minivllm.engine.core_client import EngineCoreClient
from minivllm.engine.engine_core import EngineCore
from minivllm.engine.types import EngineOutput
from minivllm.sampling_params import SamplingParams


def make_engine(config: EngineConfig) -> EngineCore | DPEngine:
    """The engine behind one frontend: one in-process core, or data_parallel_size replicas."""
    return EngineCore(config) if config.data_parallel_size == 1 else DPEngine(config)


def replica_env(config: EngineConfig, index: int) -> dict[str, str]:
    """The environment of replica `index`: its own tensor_parallel_size GPUs (of the ones
    this process sees), and this very minivllm on the import path."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(minivllm.__file__)))
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


class DPEngine:
    """The EngineCore interface the LLM frontend drives (validate_request, add_request,
    abort_requests, has_unfinished_requests, step, shutdown) over N replica processes."""

    # The same checks as one core: they read config, model_config, max_model_len, num_blocks.
    validate_request = EngineCore.validate_request

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_config = ModelConfig.from_hf(config.model)
        self.max_model_len = config.resolved_max_model_len(self.model_config)
        envs = [replica_env(config, i) for i in range(config.data_parallel_size)]
        replica_config = replace(config, data_parallel_size=1)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.replicas: list[EngineCoreClient] = []
        # Replicas start side by side (model load, KV profiling, graph capture).
        with ThreadPoolExecutor(len(envs)) as pool:
            futures = [
                pool.submit(self._start_replica, replica_config, i, env)
                for i, env in enumerate(envs)
            ]
        errors = [f.exception() for f in futures if f.exception() is not None]
        self.replicas = [f.result() for f in futures if f.exception() is None]
        self._finalizer = weakref.finalize(self, _shutdown_replicas, self.replicas)
        if errors:
            self.shutdown()
            raise errors[0]
        self.num_blocks = min(r.info.num_blocks for r in self.replicas)
        self.replica_of: dict[str, int] = {}  # req_id -> replica index, while unfinished
        self._outstanding: dict[str, int] = {}  # req_id -> tokens still to compute (estimate)
        self.load = [0] * len(self.replicas)  # outstanding tokens per replica
        self.num_assigned = [0] * len(self.replicas)  # requests ever sent to each replica

    def _start_replica(self, config: EngineConfig, index: int, env: dict) -> EngineCoreClient:
        return EngineCoreClient(config, lambda msg: self._inbox.put((index, msg)), env=env)

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        self.validate_request(prompt_token_ids, params)
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len
        cost = min(len(prompt_token_ids) + max_tokens, self.max_model_len)
        index = min(range(len(self.replicas)), key=lambda i: (self.load[i], i))
        self.replica_of[req_id] = index
        self._outstanding[req_id] = cost
        self.load[index] += cost
        self.num_assigned[index] += 1
        self.replicas[index].add_requests([(req_id, list(prompt_token_ids), params, arrival_time)])

    def abort_requests(self, req_ids: list[str]) -> None:
        by_replica: dict[int, list[str]] = {}
        for req_id in req_ids:
            if req_id in self.replica_of:
                by_replica.setdefault(self.replica_of[req_id], []).append(req_id)
                self._forget(req_id)
        for index, ids in by_replica.items():
            self.replicas[index].abort_requests(ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.replica_of)

    def step(self) -> list[EngineOutput]:
        """Waits for the next step of any replica; returns the outputs of every replica
        step that has arrived (of requests still open)."""
        if not self.replica_of:
            return []
        messages = [self._inbox.get()]
        while not self._inbox.empty():
            messages.append(self._inbox.get())
        outputs: list[EngineOutput] = []
        for index, msg in messages:
            outputs.extend(self._apply(index, msg))
        return outputs

    def _apply(self, index: int, msg: tuple) -> list[EngineOutput]:
        kind = msg[0]
        if kind == "dead":
            raise RuntimeError(f"data-parallel replica {index} died: {msg[1]}")
        if kind == "rejected":  # validated here first: only a core/frontend mismatch
            _, req_id, message = msg
            self._forget(req_id)
            return [EngineOutput(req_id, [], finished=True, finish_reason="abort")]
        if kind != "outputs":
            return []
        outputs = [o for o in msg[1] if o.req_id in self.replica_of]
        for out in outputs:
            if out.finished:
                self._forget(out.req_id)
            else:
                done = min(len(out.new_token_ids), self._outstanding[out.req_id])
                self._outstanding[out.req_id] -= done
                self.load[index] -= done
        return outputs

    def _forget(self, req_id: str) -> None:
        index = self.replica_of.pop(req_id)
        self.load[index] -= self._outstanding.pop(req_id)

    def shutdown(self) -> None:
        self._finalizer()


def _shutdown_replicas(replicas: list[EngineCoreClient]) -> None:
    """Stops every replica, side by side. A weakref finalizer: it also runs at interpreter
    exit, while the clients' threads still run (a __del__ during teardown may be too late)."""
    threads = [threading.Thread(target=replica.shutdown) for replica in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
