"""Triton compiles after the engine's warm-up (engine/warm_up.py), logged: each one is a step
that waited for a kernel variant the warm-up did not reach."""

from __future__ import annotations

import logging

import triton


def log_late_compiles(log: logging.Logger) -> bool:
    """From now on every Triton compile in this process is logged as a warning: after the
    warm-up a compile means a step (and the requests in it) waited for it, and the message
    names the kernel variant the warm-up missed. Chains a hook already set. False where
    this Triton has no compile hook (before triton.knobs)."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    previous = runtime.jit_post_compile_hook

    def hook(*, repr: str, key: object = None, **kwargs) -> object:
        # repr's argument list is garbled on some Triton versions (3.6): the kernel and its
        # launch options from it, the specialization (types, alignments, constexprs) from key.
        log.warning(
            "Triton compiled %s after the warm-up (or loaded it from its disk cache): a step "
            "waited for it; specialization %.2000s",
            repr.split("(", 1)[0],
            key,
        )
        if previous is None:
            return None
        return previous(repr=repr, key=key, **kwargs)

    runtime.jit_post_compile_hook = hook
    return True
