"""`minivllm chat`: through a pipe it answers each line with the chat history and leaves on
/exit; in process, the end of input (Ctrl-D) leaves too and /clear forgets the history."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from minivllm import SamplingParams
from minivllm.entrypoints.chat_cli import chat_loop

# The second question only makes sense with the first one in the history.
QUESTIONS = "What is the capital of France?\nAnd what is the capital of Germany?\n"
ANSWERS = ["The capital of France is Paris.", "The capital of Germany is Berlin."]


def test_chat_through_a_pipe(converted_dir, tmp_path) -> None:
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
    }
    command = ["minivllm", "chat", "--model", converted_dir, "--max-tokens", "12"]
    result = subprocess.run(
        command + ["--device", "cpu"],
        input=QUESTIONS + "/exit\nnever read\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ANSWERS


def test_chat_loop_ends_at_end_of_input_and_clear_forgets(gguf_llm) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12)
    out = io.StringIO()
    chat_loop(gguf_llm, params, io.StringIO(QUESTIONS), out, interactive=False)
    assert out.getvalue().splitlines() == ANSWERS
    fresh = io.StringIO()
    chat_loop(gguf_llm, params, io.StringIO("And what about Germany?\n"), fresh, False)
    out = io.StringIO()
    stdin = io.StringIO("What is the capital of France?\n/clear\nAnd what about Germany?\n")
    chat_loop(gguf_llm, params, stdin, out, interactive=False)
    assert out.getvalue().splitlines() == [ANSWERS[0], fresh.getvalue().strip()]
    assert not gguf_llm.engine.has_unfinished_requests()
