"""The `minivllm` command's rough edges: options checked before any model loads, every engine
flag described with its default, `serve`'s demo-model default, `bench throughput` on a CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

from minivllm.config import EngineConfig
from minivllm.entrypoints import cli, llm
from minivllm.entrypoints.engine_args import _SKIP, FLAG_HELP
from minivllm.entrypoints.server import api_server

NO_GPU = not torch.cuda.is_available()


def _minivllm(*argv: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "minivllm", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to load a model fails the test: the point is that none is loaded."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(llm.ModelConfig, "from_hf", refuse)
    monkeypatch.setattr(llm, "make_engine", refuse)
    monkeypatch.setattr(llm, "load_tokenizer", refuse)
    monkeypatch.setattr(api_server, "AsyncLLM", refuse)


def test_bad_max_tokens_fails_before_the_model_loads(no_model_load, capsys) -> None:
    assert cli.main(["generate", "--max-tokens", "-1"]) == 2
    assert "max_tokens must be at least 1" in capsys.readouterr().err


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without CUDA")
def test_device_cuda_without_a_gpu_fails_before_the_model_loads(
    tiny_qwen3_dir, no_model_load, capsys
) -> None:
    assert cli.main(["generate", "--model", tiny_qwen3_dir, "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert cli.main(["serve", tiny_qwen3_dir, "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_port_in_use_fails_before_the_model_loads(tiny_qwen3_dir, no_model_load, capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["serve", tiny_qwen3_dir, "--device", "cpu", "--port", str(port)]
        assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err


def test_serve_defaults_to_the_demo_model(tiny_qwen3_dir, monkeypatch, capsys) -> None:
    built: list[EngineConfig] = []

    def engine(config, *args, **kwargs):
        built.append(config)
        raise ValueError("stop here")

    monkeypatch.setattr(api_server, "default_model", lambda: (tiny_qwen3_dir, "[minivllm] demo"))
    monkeypatch.setattr(api_server, "AsyncLLM", engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["serve", "--device", "cpu", "--port", str(port)]) == 2
    assert built[0].model == tiny_qwen3_dir and built[0].usage_context == "server"
    assert "[minivllm] demo" in capsys.readouterr().err


def test_every_engine_flag_has_a_help_line_and_its_default(capsys) -> None:
    names = {f.name for f in dataclasses.fields(EngineConfig)} - _SKIP
    assert names == set(FLAG_HELP), "a new EngineConfig field needs a line in FLAG_HELP"
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    entries = text.split("options:", 1)[1]
    for f in dataclasses.fields(EngineConfig):
        if f.name in _SKIP:
            continue
        flag = "--" + f.name.replace("_", "-")
        after = re.split(re.escape(flag) + "[ ,]", entries, maxsplit=1)[1]
        # The flag's own entry: its help text, then its default.
        assert FLAG_HELP[f.name].split()[0] in after.split("(default:", 1)[0], flag
    assert "--block-size BLOCK_SIZE tokens per KV-cache block (a power of two) (default: 16)" in (
        text
    )
    assert "--max-tokens MAX_TOKENS tokens to generate a prompt (default: 32)" in text
    assert "(default: on)" in text.split("--enable-prefix-caching", 2)[2]


def test_bench_throughput_help_names_the_command() -> None:
    result = _minivllm("bench", "throughput", "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: minivllm bench throughput")
    assert "--quick" in result.stdout and "bench_throughput.py" not in result.stdout


def test_bench_throughput_without_a_gpu_says_so_and_exits_2() -> None:
    result = _minivllm("bench", "throughput", env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr and "--quick" in result.stderr
    assert "minivllm bench throughput: error:" in result.stderr


def test_bench_latency_without_a_gpu_refuses_at_once() -> None:
    start = time.perf_counter()
    result = _minivllm("bench", "latency", env={"CUDA_VISIBLE_DEVICES": ""}, timeout=60)
    assert result.returncode == 2
    assert "minivllm bench latency: error: needs a CUDA GPU" in result.stderr
    assert time.perf_counter() - start < 30  # not a model load, not a run


def test_bench_throughput_quick_runs_on_a_cpu_with_progress() -> None:
    argv = ("bench", "throughput", "--quick", "--num-seqs", "2", "--kv-cache-dtype", "auto")
    result = _minivllm(*argv, env={"CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["workload"] == "quick" and line["num_requests"] == 2
    assert "Processed prompts" in result.stderr  # the progress bar


def test_every_option_of_every_command_has_help() -> None:
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    silent = [
        f"{name} {action.option_strings[0]}"
        for name, sub in commands.items()
        for action in sub._actions
        if action.option_strings and not (action.help or "").strip()
    ]
    assert silent == []


def test_a_bad_json_option_names_the_flag_and_the_problem(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["generate", "--speculative-config", "{bad"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --speculative-config: not valid JSON" in err and "_json_object" not in err


def test_the_command_line_parses_without_torch() -> None:
    # `minivllm --help` and a bad option answer at once: torch (seconds) loads with an engine.
    code = (
        "import sys; from minivllm.entrypoints.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_serve_without_the_server_extra_says_which_to_install() -> None:
    code = (
        "import sys; sys.modules['uvicorn'] = None; "  # as if the extra were not installed
        "from minivllm.entrypoints.cli import main; sys.exit(main(['serve']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "needs the server extra (uvicorn is not installed)" in result.stderr
    assert "pip install -e '.[server]'" in result.stderr
