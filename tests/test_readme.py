"""The README's two commands: CI runs the test command as written; the generate command's
final step runs here as written (the install steps before it are what CI just did)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command() -> None:
    generate_cmd, test_cmd = readme_commands()[:2]
    assert "pytest" in test_cmd and "minivllm generate" in generate_cmd
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
    assert "RANDOM weights" in result.stderr
    assert '"num_tokens": 5' in result.stdout
