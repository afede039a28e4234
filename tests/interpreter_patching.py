"""Triton's interpreter re-patches triton.language on every call of a nested @triton.jit function
(tile_origin, tl.cdiv, tl.zeros, ...: a scan of each module's members, a few ms a call, about a
third of an engine step in the interpreter). Within one launch the patches it would make are
already in place, so those calls skip it; a launch still patches and restores as before.
It also computes an overflow check for every integer add, sub and mul (int64 copies, bounds,
a device_assert), then drops it: its device_assert asserts only under debug, which the
interpreter never sets (about half of an engine step in the interpreter). Without debug those
checks are not computed. The kernels compute what they computed: only the interpreter's
bookkeeping is shortened."""

from __future__ import annotations

import dataclasses
import inspect


class _AlreadyPatched:
    def restore(self) -> None:
        pass


class _Launch:
    """A launch's patch scope: restoring it also ends the launch."""

    def __init__(self, scope, launches: list[set[int]]) -> None:
        self.scope = scope
        self.launches = launches

    def restore(self) -> None:
        self.launches.pop()
        self.scope.restore()


def install() -> bool:
    """Shortens the interpreter's patching in this process; False (and nothing changed) where
    this triton has no such interpreter internals."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter

        patch_lang, patch_attr = interpreter._patch_lang, interpreter._patch_attr
        is_builtin = tl.core.is_builtin
    except (ImportError, AttributeError):
        return False
    # launches[-1]: the language modules (ids) the launch in progress has patched.
    launches: list[set[int]] = []
    builtins: dict[object, list] = {}

    def patch_builtin(pkg, builder, scope) -> None:
        # Read once, before any launch patches them: the members the original scans for.
        if pkg not in builtins:
            builtins[pkg] = [(n, m) for n, m in inspect.getmembers(pkg) if is_builtin(m)]
        for name, member in builtins[pkg]:
            patch_attr(pkg, name, member, builder, scope)

    def patch_lang_once(fn):
        langs = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if not launches:  # a launch: patched, restored when it ends
            scope = patch_lang(fn)
            launches.append(langs)
            return _Launch(scope, launches)
        if langs <= launches[-1]:  # a nested call: these modules are patched already
            return _AlreadyPatched()
        scope = patch_lang(fn)  # (the interpreter never restores a nested call's patches)
        launches[-1] |= langs
        return scope

    interpreter._patch_builtin = patch_builtin
    interpreter._patch_lang = patch_lang_once
    skip_dropped_overflow_checks(interpreter)
    return True


def skip_dropped_overflow_checks(interpreter) -> None:
    """The interpreter's integer-overflow checks off where its device_assert drops them."""
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True):
        return
    if getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
