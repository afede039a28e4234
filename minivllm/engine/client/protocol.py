"""The engine boundary a frontend sees: the EngineClient protocol, which an in-process
EngineCore, DPEngine and the process clients (EngineCoreClient, DPCoreClient) implement, and
the kinds of message between a process client and its engine-core process."""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from minivllm.engine.stats import CoreInfo
from minivllm.engine.types import EngineRequest


class EngineClient(Protocol):
    """Takes requests and aborts, one call each. Requests arrive validated: the frontend
    checks each one once against `info` (request_checks.check_request) before it adds it."""

    info: CoreInfo  # the engine as it was built: limits a request must fit

    def add_requests(self, requests: list[EngineRequest]) -> None: ...

    def abort_requests(self, req_ids: list[str]) -> None:
        """Unknown and finished ids are ignored."""
        ...

    def shutdown(self) -> None:
        """Frees devices and processes; idempotent."""
        ...


class MessageKind(Enum):
    """The first element of every message (a pickled tuple) between EngineCoreClient and
    core_process; core_process's docstring lists each one's fields."""

    # To the core.
    CONFIG = "config"
    ADD = "add"
    ABORT = "abort"
    SHUTDOWN = "shutdown"
    # From the core.
    READY = "ready"
    FAILED = "failed"
    OUTPUTS = "outputs"
    REJECTED = "rejected"
    DEAD = "dead"
