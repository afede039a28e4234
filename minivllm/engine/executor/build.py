"""build_executor: the executor an engine's configuration asks for.

- LocalExecutor (executor/local.py): one process, one device (tensor_parallel_size == 1).
- TPExecutor (executor/tp_executor.py): this process is rank 0 and starts ranks 1..N-1.
- TorchrunExecutor (executor/torchrun.py): torchrun started every rank.
"""

from __future__ import annotations

from minivllm.engine.executor.base import Executor
from minivllm.engine.executor.local import LocalExecutor
from minivllm.engine.executor.torchrun import TorchrunExecutor, torchrun_rank
from minivllm.engine.executor.tp_executor import TPExecutor
from minivllm.engine.setup import EngineSetup


def build_executor(setup: EngineSetup) -> Executor:
    if setup.config.tensor_parallel_size == 1:
        return LocalExecutor(setup)
    launched = torchrun_rank()
    if launched is not None:
        return TorchrunExecutor(setup, *launched)
    return TPExecutor(setup)
