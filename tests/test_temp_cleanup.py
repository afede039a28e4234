"""A passing run of the suite leaves nothing in the temp directory (pyproject's pytest options):
a pytest run in a subprocess, with this repository's configuration, writes into tmp_path and a
session temp dir, passes, and its temp root is empty afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TEST = """
import pytest

@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("checkpoint") / "weights.bin"
    path.write_bytes(b"0" * (1 << 20))
    return path

def test_writes(tmp_path, checkpoint):
    (tmp_path / "log.txt").write_text("x" * 1000)
    assert checkpoint.exists()
"""


def test_a_passing_run_leaves_no_temp_files(tmp_path):
    temp_root = tmp_path / "temp-root"
    temp_root.mkdir()
    test_file = tmp_path / "test_writes.py"
    test_file.write_text(_TEST)
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(temp_root)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), str(test_file)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:]
    left = [p for p in temp_root.rglob("*") if p.is_file()]
    assert left == [], left
