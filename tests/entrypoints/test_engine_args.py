"""The engine flags: one per EngineConfig field, typed from the field's annotation."""

from __future__ import annotations

import argparse
import dataclasses

from minivllm.config import _CHOICES, DTYPES, EngineConfig
from minivllm.entrypoints.engine_args import add_engine_options, engine_options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    return parser


def test_flag_types_follow_field_types() -> None:
    actions = {a.dest: a for a in _parser()._actions}
    names = {f.name for f in dataclasses.fields(EngineConfig)} - {"model", "usage_context"}
    assert names <= set(actions)
    assert actions["gpu_memory_utilization"].type is float
    assert actions["tokenizer"].type is str  # str | None
    assert actions["max_num_seqs"].type is int  # int | None
    assert actions["block_size"].type is int
    assert isinstance(actions["enforce_eager"], argparse.BooleanOptionalAction)
    assert actions["kv_cache_dtype"].choices == ("auto", "fp8", "fp8_e4m3")
    assert all(actions[n].default is None for n in names)


def test_parsed_flags_become_options() -> None:
    args = _parser().parse_args(
        ["--gpu-memory-utilization", "0.5", "--no-enable-prefix-caching", "--max-num-seqs", "4"]
    )
    assert engine_options(args) == {
        "gpu_memory_utilization": 0.5,
        "enable_prefix_caching": False,
        "max_num_seqs": 4,
    }


def test_choices_come_from_the_literals() -> None:
    assert _CHOICES["dtype"] == ("auto", *DTYPES)
    assert _CHOICES["attention_backend"] == ("auto", "triton", "torch_sdpa")
    assert _CHOICES["prefill_attention_kernel"] == ("auto", "triton", "gluon")
    assert _CHOICES["scheduling_policy"] == ("fcfs", "priority")
    assert set(_CHOICES) == {
        "dtype", "device", "load_format", "attention_backend", "prefill_attention_kernel",
        "kv_cache_dtype", "usage_context", "scheduling_policy",
    }  # fmt: skip
