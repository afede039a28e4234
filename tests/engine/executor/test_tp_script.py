"""TP as a user runs it: a script without `if __name__ == "__main__":` gives TP=1's tokens,
logprobs and prompt logprobs and exits by itself with its LLM still alive (no orphan); a
parent killed outright takes its workers with it."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
import time

from minivllm import LLM, SamplingParams

PROMPTS = [[5, 17, 42, 99, 3], list(range(40, 71))]
PARAMS = [
    dict(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2, prompt_logprobs=1),
    dict(temperature=0.9, max_tokens=6, ignore_eos=True, seed=5, logprobs=1),
]

# No main guard, no shutdown(): the way people write vLLM scripts.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from minivllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], dtype="float32", device="cpu", block_size=4, tensor_parallel_size=2)
    print("PIDS", json.dumps([w.pid for w in llm.engine.executor.workers]), flush=True)
    params = [SamplingParams(**p) for p in json.loads(sys.argv[3])]
    prompts = [{"prompt_token_ids": p} for p in json.loads(sys.argv[2])]
    outs = llm.generate(prompts, params, use_tqdm=False)
    print("RESULT", json.dumps(SUMMARY(outs)), flush=True)
    if len(sys.argv) > 4:
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


def summary(outs) -> list:
    """Tokens, rounded logprobs of each position, rounded prompt logprobs."""

    def rounded(entries):
        if entries is None:
            return None
        return [
            None if e is None else {str(t): round(lp.logprob, 3) for t, lp in e.items()}
            for e in entries
        ]

    return [
        [o.outputs[0].token_ids, rounded(o.outputs[0].logprobs), rounded(o.prompt_logprobs)]
        for o in outs
    ]


def script_text() -> str:
    """SCRIPT, preceded by summary() under the name SUMMARY."""
    helper = inspect.getsource(summary).replace("def summary", "def SUMMARY")
    return "import json\n" + helper + SCRIPT


def run_script(model_dir: str, tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    path = tmp_path / "user_script.py"
    path.write_text(script_text())
    cmd = [sys.executable, str(path), model_dir, json.dumps(PROMPTS), json.dumps(PARAMS), *extra]
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return result, time.monotonic() - start


def line(result: subprocess.CompletedProcess, tag: str):
    found = [x for x in result.stdout.splitlines() if x.startswith(tag + " ")]
    assert found, result.stderr[-3000:]
    return json.loads(found[0][len(tag) + 1 :])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def test_script_without_main_guard_matches_tp1_and_exits(tiny_qwen3_dir: str, tmp_path) -> None:
    result, seconds = run_script(tiny_qwen3_dir, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seconds < 60
    assert wait_gone(line(result, "PIDS"), 5)  # interpreter exit stopped the workers
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    params = [SamplingParams(**p) for p in PARAMS]
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert line(result, "RESULT") == json.loads(json.dumps(summary(outs)))


def test_killed_parent_takes_its_workers_along(tiny_qwen3_dir: str, tmp_path) -> None:
    result, _ = run_script(tiny_qwen3_dir, tmp_path, "kill-self")
    assert result.returncode == -9
    assert wait_gone(line(result, "PIDS"), 5)
