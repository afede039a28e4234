"""Data parallelism for LLM: N engine replicas, each an EngineCore in its own process (its
own scheduler, KV cache and tensor_parallel_size GPUs), behind one EngineCore-like frontend.

DPCoreClient starts the replicas and balances the requests (fewest outstanding tokens);
this class turns its messages into step() results. `make_engine` picks this or an EngineCore.
"""

from __future__ import annotations

import queue

from minivllm.config import EngineConfig, ModelConfig
from minivllm.engine.client.dp_core_client import DPCoreClient, replica_env
from minivllm.engine.engine_core import EngineCore
from minivllm.engine.request_checks import check_request
from minivllm.engine.types import EngineOutput
from minivllm.sampling_params import SamplingParams

__all__ = ["DPEngine", "make_engine", "replica_env"]


def make_engine(config: EngineConfig) -> EngineCore | DPEngine:
    """The engine behind one frontend: one in-process core, or data_parallel_size replicas."""
    return EngineCore(config) if config.data_parallel_size == 1 else DPEngine(config)


class DPEngine:
    """The EngineCore interface the LLM frontend drives (validate_request, add_request,
    abort_requests, has_unfinished_requests, step, shutdown) over N replica processes."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_config = ModelConfig.from_hf(config.model)
        self.max_model_len = config.resolved_max_model_len(self.model_config)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.client = DPCoreClient(config, self._inbox.put)
        self.balancer = self.client.balancer
        self.num_blocks = self.client.info.num_blocks
        self.info = self.client.info  # the smallest replica's KV cache

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """The same checks as one core (request_checks)."""
        check_request(prompt_token_ids, params, self.info, self.config.max_logprobs)

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        self.validate_request(prompt_token_ids, params)
        self.client.add_requests([(req_id, list(prompt_token_ids), params, arrival_time)])

    def abort_requests(self, req_ids: list[str]) -> None:
        self.client.abort_requests(req_ids)

    def has_unfinished_requests(self) -> bool:
        return self.client.has_unfinished_requests()

    def step(self) -> list[EngineOutput]:
        """Waits for the next step of any replica; returns the outputs of every replica
        step that has arrived (of requests still open)."""
        if not self.client.has_unfinished_requests():
            return []
        messages = [self._inbox.get()]
        while not self._inbox.empty():
            messages.append(self._inbox.get())
        outputs: list[EngineOutput] = []
        for msg in messages:
            kind = msg[0]
            if kind == "dead":
                raise RuntimeError(msg[1])
            if kind == "rejected":  # validated here first: only a core/frontend mismatch
                outputs.append(EngineOutput(msg[1], [], finished=True, finish_reason="abort"))
            elif kind == "outputs":
                outputs.extend(msg[1])
        return outputs

    def shutdown(self) -> None:
        self.client.shutdown()
