"""A spec's check as plain data: the engine that will run a request compiles its spec and
answers with a CheckOutcome, which crosses from an engine-core process to its frontend; the
frontend raises what it says before the request is queued (a 400, a 503, a 500), and
remembers the specs that compiled (CompiledSpecs)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Literal

from minivllm.structured_output.compiler import CompilerBusy
from minivllm.structured_output.params import StructuredOutputSpec

# Specs a frontend remembers as compiled by its engine (16 bytes each).
KNOWN_SPECS = 4096

# How long a frontend waits for a check: the compiler's own time limit (30 s) answers
# first, unless the grammar backend's first build (a second or more) comes before it.
CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CheckOutcome:
    """error: None (the spec compiled: the engine's cache holds it for the request),
    "invalid" (it cannot be honoured, or not within the time limit: ValueError),
    "busy" (no compile worker is free: CompilerBusy), or "unavailable" (the grammar backend
    cannot be built here: RuntimeError); message: what to tell the user."""

    error: Literal["invalid", "busy", "unavailable"] | None = None
    message: str = ""
    num_workers: int = 0  # busy: the compiler's workers, for CompilerBusy's message

    @classmethod
    def of_compile(cls, compiled: Future) -> CheckOutcome:
        """The outcome of a finished compile future (a ValueError is the spec's fault;
        anything else is the engine's)."""
        error = compiled.exception()
        if error is None:
            return cls()
        return cls.of_error(error)

    @classmethod
    def of_error(cls, error: BaseException) -> CheckOutcome:
        if isinstance(error, CompilerBusy):
            return cls("busy", str(error), error.num_workers)
        if isinstance(error, ValueError):
            return cls("invalid", str(error))
        return cls("unavailable", f"{type(error).__name__}: {error}")

    def raise_error(self) -> None:
        """Raises what the outcome says, if anything."""
        if self.error == "invalid":
            raise ValueError(self.message)
        if self.error == "busy":
            raise CompilerBusy(self.num_workers)
        if self.error == "unavailable":
            raise RuntimeError(self.message)


def check_timed_out(kind: str) -> ValueError:
    """A check that got no answer within CHECK_TIMEOUT_S."""
    return ValueError(
        f"compiling the structured output {kind} took longer than {CHECK_TIMEOUT_S:g} s"
    )


def wait_for_check(outcome: Future[CheckOutcome], kind: str) -> None:
    """Waits (up to CHECK_TIMEOUT_S) for a check's outcome and raises what it says."""
    try:
        result = outcome.result(CHECK_TIMEOUT_S)
    except FutureTimeout:  # the builtin TimeoutError from Python 3.11 on
        raise check_timed_out(kind) from None
    result.raise_error()


class CompiledSpecs:
    """The specs an engine has compiled, the `capacity` most recently checked, kept as
    digests (a spec may be 256 KiB): a frontend queues their requests without asking the
    engine again. Should the engine's cache have dropped one, the request compiles it again
    there (it compiled once; only a compile past the time limit would fail it, at its first
    step). Not thread-safe: one event loop uses it."""

    def __init__(self, capacity: int = KNOWN_SPECS) -> None:
        self._capacity = capacity
        self._digests: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, spec: StructuredOutputSpec) -> bool:
        digest = _digest(spec)
        if digest in self._digests:
            self._digests.move_to_end(digest)
            return True
        return False

    def add(self, spec: StructuredOutputSpec) -> None:
        digest = _digest(spec)
        self._digests[digest] = None
        self._digests.move_to_end(digest)
        if len(self._digests) > self._capacity:
            self._digests.popitem(last=False)

    def __len__(self) -> int:
        return len(self._digests)


def _digest(spec: StructuredOutputSpec) -> bytes:
    return hashlib.blake2b(f"{spec.kind}\0{spec.text}".encode(), digest_size=16).digest()
