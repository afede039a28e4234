"""max_num_seqs / max_num_batched_tokens: auto defaults from device memory and usage,
explicit values winning, and validation."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from minivllm.config import EngineConfig
from minivllm.engine.sched.limits import SchedulerLimits, auto_scheduler_limits
from minivllm.engine.setup import resolve_scheduler_limits
from minivllm.entrypoints.cli import main as cli_main

GiB = 2**30


@pytest.mark.parametrize(
    ("memory", "device_type", "usage", "name", "expected"),
    [
        (141 * GiB, "cuda", "offline", "NVIDIA H200", (1024, 16384)),
        (141 * GiB, "cuda", "server", "NVIDIA H200", (1024, 8192)),
        (70 * GiB, "cuda", "offline", "", (1024, 16384)),
        (70 * GiB - 1, "cuda", "offline", "", (256, 8192)),
        (24 * GiB, "cuda", "server", "NVIDIA L4", (256, 2048)),
        (80 * GiB, "cuda", "offline", "NVIDIA A100-SXM4-80GB", (256, 8192)),
        (512 * GiB, "cpu", "offline", "", (256, 8192)),
        (0, "cpu", "server", "", (256, 8192)),
    ],
)
def test_auto_rule(memory, device_type, usage, name, expected) -> None:
    assert auto_scheduler_limits(memory, device_type, usage, name) == expected


def test_auto_rule_rejects_unknown_usage() -> None:
    with pytest.raises(ValueError, match="usage"):
        auto_scheduler_limits(GiB, "cuda", "batch")


def _fake_h200(monkeypatch) -> None:
    props = SimpleNamespace(total_memory=141 * GiB, name="NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)


def test_resolve_reads_the_device_and_explicit_values_win(tmp_path, monkeypatch) -> None:
    _fake_h200(monkeypatch)
    cuda = torch.device("cuda")
    model = str(tmp_path)
    assert resolve_scheduler_limits(EngineConfig(model=model), cuda) == (1024, 16384)
    server = EngineConfig(model=model, usage_context="server")
    assert resolve_scheduler_limits(server, cuda) == (1024, 8192)
    seqs_only = EngineConfig(model=model, max_num_seqs=3)
    assert resolve_scheduler_limits(seqs_only, cuda) == (3, 16384)
    both = EngineConfig(model=model, max_num_seqs=7, max_num_batched_tokens=100)
    assert resolve_scheduler_limits(both, cuda) == SchedulerLimits(7, 100)
    assert resolve_scheduler_limits(EngineConfig(model=model), torch.device("cpu")) == (256, 8192)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"usage_context": "batch"}, "usage_context"),
    ],
)
def test_config_rejects_bad_limits(tmp_path, options, match) -> None:
    with pytest.raises(ValueError, match=match):
        EngineConfig.from_options(str(tmp_path), **options)


def test_usage_context_is_not_a_cli_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        cli_main(["generate", "--usage-context", "server"])
    assert "unrecognized arguments: --usage-context" in capsys.readouterr().err


def test_engine_runs_with_resolved_limits(tiny_qwen3_dir, caplog) -> None:
    from minivllm import LLM, SamplingParams

    with caplog.at_level(logging.INFO, logger="minivllm.engine.engine_core"):
        llm = LLM(tiny_qwen3_dir, max_num_batched_tokens=64, kv_cache_memory=1 << 22)
    try:
        assert llm.engine.setup.limits == (256, 64)
        assert llm.engine.scheduler.max_num_batched_tokens == 64
        assert "max_num_seqs=256, max_num_batched_tokens=64" in caplog.text
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 2
    finally:
        llm.shutdown()
