"""Leaving the process group at shutdown without waiting for peers that may be gone."""

from __future__ import annotations

import sys
import threading

import torch.distributed as dist


def release_process_group(timeout: float = 10.0) -> bool:
    """Leaves the default process group; True once it is gone. NCCL is aborted
    (ncclCommAbort), not destroyed: destroy_process_group finalizes the communicators and waits
    for every peer, and on two H200s rank 0 waited forever once its workers had exited. Gloo is
    destroyed (local). Runs on a daemon thread so that a teardown stuck in a driver call cannot
    keep the caller, or the interpreter's exit, waiting past timeout seconds. While the
    interpreter finalizes (an LLM dropped at exit) it does nothing and returns False: a thread
    started then never runs (start() would wait forever), and the ending process frees the
    group anyway."""
    if sys.is_finalizing():
        return False
    done = threading.Event()

    def release() -> None:
        try:
            if dist.is_initialized():
                if dist.get_backend() == "nccl":
                    dist.distributed_c10d._abort_process_group()
                else:
                    dist.destroy_process_group()
        except Exception:  # already aborted after a worker died: nothing is left to free
            pass
        finally:
            done.set()

    threading.Thread(target=release, name="minivllm-pg-release", daemon=True).start()
    return done.wait(timeout)
