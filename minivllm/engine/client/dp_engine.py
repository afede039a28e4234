"""Data parallelism for LLM: N engine replicas, each an EngineCore in its own process (its
own scheduler, KV cache and tensor_parallel_size GPUs), behind an EngineClient that steps as
an EngineCore does.

DPCoreClient starts the replicas and balances the requests (fewest outstanding tokens);
this class turns its messages into step() results. `make_engine` picks this or an EngineCore.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future

from minivllm.config import EngineConfig
from minivllm.engine.client.dp_core_client import DPCoreClient, replica_env
from minivllm.engine.client.protocol import MessageKind
from minivllm.engine.engine_core import EngineCore
from minivllm.engine.types import EngineOutput, EngineRequest
from minivllm.models.model_config import ModelConfig
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.params import StructuredOutputSpec

__all__ = ["DPEngine", "make_engine", "replica_env"]


def make_engine(config: EngineConfig, model_config: ModelConfig) -> EngineCore | DPEngine:
    """The engine behind one frontend: one in-process core, or data_parallel_size replicas."""
    if config.data_parallel_size == 1:
        return EngineCore(config, model_config)
    return DPEngine(config, model_config)


class DPEngine:
    """EngineCore's interface to a frontend (the EngineClient calls, has_unfinished_requests
    and step) over N replica processes."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.client = DPCoreClient(config, model_config, self._inbox.put)
        self.balancer = self.client.balancer
        self.num_blocks = self.client.info.num_blocks
        self.info = self.client.info  # the smallest replica's KV cache
        # Added, not aborted, and not yet seen finished by step(). Not the balancer's open
        # requests: it forgets a request (reader thread) before its last output is queued.
        self._open: set[str] = set()

    def add_requests(self, requests: list[EngineRequest]) -> None:
        self._open.update(r.req_id for r in requests)
        self.client.add_requests(requests)

    def abort_requests(self, req_ids: list[str]) -> None:
        self._open.difference_update(req_ids)
        self.client.abort_requests(req_ids)

    def check_grammar(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CheckOutcome]:
        return self.client.check_grammar(spec, refuse_when_busy)

    def has_unfinished_requests(self) -> bool:
        return bool(self._open)

    def step(self) -> list[EngineOutput]:
        """Waits for the next step of any replica; returns the outputs of every replica
        step that has arrived (of requests still open)."""
        if not self._open:
            return []
        messages = [self._inbox.get()]
        while not self._inbox.empty():
            messages.append(self._inbox.get())
        outputs: list[EngineOutput] = []
        for msg in messages:
            kind = msg[0]
            if kind is MessageKind.DEAD:
                raise RuntimeError(msg[1])
            if kind is MessageKind.REJECTED:  # only an id still in use
                outputs.append(EngineOutput(msg[1], [], finished=True, finish_reason="abort"))
            elif kind is MessageKind.OUTPUTS:
                outputs.extend(msg[1])
        self._open.difference_update(o.req_id for o in outputs if o.finished)
        return outputs

    def shutdown(self) -> None:
        self.client.shutdown()
