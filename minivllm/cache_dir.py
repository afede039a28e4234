"""minivllm's on-disk cache: where it lives, and how an entry is written so that no reader
sees half of one (built in a temporary directory beside it, then renamed into place)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable


def cache_root() -> str:
    """$MINIVLLM_CACHE_DIR, else $XDG_CACHE_HOME/minivllm, else ~/.cache/minivllm."""
    root = os.environ.get("MINIVLLM_CACHE_DIR")
    if root:
        return root
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "minivllm")


def publish_dir(path: str, fill: Callable[[str], None]) -> None:
    """Creates directory `path` by fill(tmp) into a fresh temporary directory beside it and a
    rename; if another process published `path` meanwhile, its directory stays and ours goes.
    OSError when the cache cannot be written (or fill's own errors)."""
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".partial-")
    try:
        fill(tmp)
        try:
            os.rename(tmp, path)
            tmp = None
        except OSError:
            if not os.path.isdir(path):
                raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
