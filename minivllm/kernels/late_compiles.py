"""Triton compiles after the engine's warm-up (engine/warm_up.py), logged: each one is a step
that waited for a kernel variant the warm-up did not reach.

Triton has one compile hook per process, so there is one LateCompileLog per process however
many engines it builds: a second engine adds no second hook (which would log every compile
twice), and while an engine is starting (`engine_starting()`: model load, graph capture,
warm-up) its compiles are expected and not logged, even with an earlier engine's hook set.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator


class LateCompileLog:
    """The compile hook: every Triton compile logged as a warning (a step waited for it), but
    none while an engine is starting (`paused`). Chains the hook that was set before it."""

    def __init__(self, log: logging.Logger, previous) -> None:
        self.log = log
        self.previous = previous
        self.paused = 0  # engines starting now

    def __call__(self, *, repr: str, key: object = None, **kwargs) -> object:
        if not self.paused:
            # repr's argument list is garbled on some Triton versions (3.6): the kernel and
            # its launch options from it, the specialization (types, alignments, constexprs)
            # from key.
            self.log.warning(
                "Triton compiled %s after the warm-up (or loaded it from its disk cache): a "
                "step waited for it; specialization %.2000s",
                repr.split("(", 1)[0],
                key,
            )
        if self.previous is None:
            return None
        return self.previous(repr=repr, key=key, **kwargs)


def _runtime_knobs(triton):
    """triton.knobs.runtime, or None where this Triton has no compile hook (before knobs)."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    return runtime if runtime is not None and hasattr(runtime, "jit_post_compile_hook") else None


def log_late_compiles(log: logging.Logger) -> bool:
    """From now on every Triton compile in this process is logged as a warning on `log` (once:
    a hook already set by an earlier engine stays). False where this Triton has no hook."""
    import triton

    runtime = _runtime_knobs(triton)
    if runtime is None:
        return False
    if not isinstance(runtime.jit_post_compile_hook, LateCompileLog):
        runtime.jit_post_compile_hook = LateCompileLog(log, runtime.jit_post_compile_hook)
    return True


@contextlib.contextmanager
def engine_starting() -> Iterator[None]:
    """Compiles inside are an engine's start-up (loading, capturing graphs, warming up), not
    late: a LateCompileLog already set (by an earlier engine in this process) skips them.
    Imports nothing: with triton never imported, no hook can be set."""
    triton = sys.modules.get("triton")
    runtime = None if triton is None else _runtime_knobs(triton)
    hook = None if runtime is None else runtime.jit_post_compile_hook
    if not isinstance(hook, LateCompileLog):
        yield
        return
    hook.paused += 1
    try:
        yield
    finally:
        hook.paused -= 1
