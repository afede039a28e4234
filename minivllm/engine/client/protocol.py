"""The engine boundary a frontend sees: the EngineClient protocol, which an in-process
EngineCore, DPEngine and the process clients (EngineCoreClient, DPCoreClient) implement, and
the kinds of message between a process client and its engine-core process."""

from __future__ import annotations

from concurrent.futures import Future
from enum import Enum
from typing import Protocol

from minivllm.engine.stats import CoreInfo
from minivllm.engine.types import EngineRequest
from minivllm.structured_output.check import CheckOutcome
from minivllm.structured_output.params import StructuredOutputSpec


class EngineClient(Protocol):
    """Takes requests and aborts, one call each. Requests arrive validated: the frontend
    checks each one once against `info` (request_checks.check_request) before it adds it."""

    info: CoreInfo  # the engine as it was built: limits a request must fit

    def add_requests(self, requests: list[EngineRequest]) -> None: ...

    def abort_requests(self, req_ids: list[str]) -> None:
        """Unknown and finished ids are ignored."""
        ...

    def check_grammar(
        self, spec: StructuredOutputSpec, refuse_when_busy: bool = False
    ) -> Future[CheckOutcome]:
        """The outcome of compiling a constrained request's spec in the engine that will run
        it, asked before the request is added (its compile is then a cache hit there: each
        spec compiles once). refuse_when_busy: "busy" at once while no compile worker is free.
        """
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
    CHECK_GRAMMAR = "check_grammar"
    SHUTDOWN = "shutdown"
    # From the core.
    READY = "ready"
    FAILED = "failed"
    OUTPUTS = "outputs"
    REJECTED = "rejected"
    GRAMMAR_CHECKED = "grammar_checked"
    DEAD = "dead"
