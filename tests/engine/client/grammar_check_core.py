"""An engine core without a model for test_grammar_check.py, loaded by the core process
through MINIVLLM_CORE_FACTORY: its grammar checks are a real StructuredOutputManager's."""

from __future__ import annotations

import os

from minivllm.engine.stats import CoreInfo, EngineStats
from minivllm.structured_output.manager import StructuredOutputManager


class CheckingCore:
    def __init__(self, config, model_config) -> None:
        self.info = CoreInfo(
            max_model_len=64,
            vocab_size=model_config.vocab_size,
            num_blocks=8,
            block_size=4,
            pid=os.getpid(),
        )
        self.structured_outputs = StructuredOutputManager(
            config.resolved_tokenizer(), model_config.vocab_size, max_num_seqs=4
        )

    def check_grammar(self, spec, refuse_when_busy=False):
        return self.structured_outputs.check(spec, refuse_when_busy)

    def add_requests(self, requests) -> None:
        pass

    def abort_requests(self, req_ids) -> None:
        pass

    def has_unfinished_requests(self) -> bool:
        return False

    def stats(self) -> EngineStats:
        return EngineStats()

    def shutdown(self) -> None:
        pass
