"""Tensor parallelism across two "nodes" on loopback (gloo): node 0 is an LLM in this process
(tensor_parallel_size=2, nnodes=2), node 1 is `minivllm serve MODEL --headless --node-rank 1`.
Greedy tokens equal TP=1's; the node-1 launcher exits 0 by itself after LLM.shutdown(); a
node-1 rank killed mid-run fails the LLM within seconds naming rank 1 and node 1; a hung one
(SIGSTOP) fails it after distributed_timeout_seconds; every launcher exits by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.executor.tp_executor import free_port

PROMPTS = [{"prompt_token_ids": [5, 17, 42, 99, 3]}, {"prompt_token_ids": list(range(40, 71))}]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
ENGINE = {"dtype": "float32", "device": "cpu", "block_size": 4}
ENGINE_FLAGS = ["--dtype", "float32", "--device", "cpu", "--block-size", "4"]


def start_node1(model_dir: str, port: int, timeout_s: int, log_path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "minivllm", "serve", model_dir, "--headless",
        "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
        "--master-addr", "127.0.0.1", "--master-port", str(port),
        "--distributed-timeout-seconds", str(timeout_s), *ENGINE_FLAGS,
    ]  # fmt: skip
    log = open(log_path, "w")  # noqa: SIM115 - the child holds it; closed with the test
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def head_llm(model_dir: str, port: int, timeout_s: int) -> LLM:
    return LLM(
        model_dir,
        tensor_parallel_size=2,
        nnodes=2,
        master_port=port,
        distributed_timeout_seconds=timeout_s,
        **ENGINE,
    )


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def exits_by_itself(proc: subprocess.Popen, timeout: float) -> int:
    """proc's exit code; kills it (and its ranks) and fails the test if it outlives timeout."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in children(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        pytest.fail(f"the node-1 launcher did not exit within {timeout} s")


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def tp1_tokens(model_dir: str) -> list[list[int]]:
    llm = LLM(model_dir, **ENGINE)
    try:
        return tokens(llm.generate(PROMPTS, PARAMS, use_tqdm=False))
    finally:
        llm.shutdown()


def test_two_nodes_match_tp1_and_exit(tiny_qwen3_dir: str, tmp_path) -> None:
    port = free_port()
    node1 = start_node1(tiny_qwen3_dir, port, 30, tmp_path / "node1.log")
    try:
        llm = head_llm(tiny_qwen3_dir, port, 30)
        try:
            assert llm.engine.executor.workers == []  # node 0 has no other rank
            first = tokens(llm.generate(PROMPTS, PARAMS, use_tqdm=False))
            second = tokens(llm.generate(PROMPTS, PARAMS, use_tqdm=False))  # still in step
        finally:
            llm.shutdown()
    finally:
        code = exits_by_itself(node1, timeout=30)
    assert code == 0, (tmp_path / "node1.log").read_text()[-3000:]
    assert first == second == tp1_tokens(tiny_qwen3_dir)


def kill_rank1_mid_run(model_dir: str, tmp_path, sig: int, timeout_s: int) -> tuple[str, float]:
    """Sends sig to node 1's rank in rank 0's third forward; returns (the error, seconds from
    the signal to the error)."""
    port = free_port()
    node1 = start_node1(model_dir, port, timeout_s, tmp_path / "node1.log")
    rank1 = None
    try:
        llm = head_llm(model_dir, port, timeout_s)
        (rank1,) = children(node1.pid)
        sent = []
        calls = [0]

        def hook(module, args):
            calls[0] += 1
            if calls[0] == 3:
                os.kill(rank1, sig)
                sent.append(time.monotonic())

        llm.engine.executor.runner.model.attention_layers()[1].register_forward_pre_hook(hook)
        many = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
        with pytest.raises(RuntimeError) as info:
            llm.generate(PROMPTS[:1], many, use_tqdm=False)
        elapsed = time.monotonic() - sent[0]
        llm.shutdown()
    finally:
        code = exits_by_itself(node1, timeout=30)
    assert code == 1
    with pytest.raises(ProcessLookupError):
        os.kill(rank1, 0)  # the launcher reaped its rank
    return str(info.value), elapsed


def test_rank_killed_on_node1_fails_fast_naming_it(tiny_qwen3_dir: str, tmp_path) -> None:
    error, elapsed = kill_rank1_mid_run(tiny_qwen3_dir, tmp_path, signal.SIGKILL, timeout_s=60)
    assert "rank 1 on node 1" in error and "exit code -9" in error
    assert elapsed < 10  # far below the 60 s collective timeout


def test_hung_rank_on_node1_fails_after_the_timeout(tiny_qwen3_dir: str, tmp_path) -> None:
    error, elapsed = kill_rank1_mid_run(tiny_qwen3_dir, tmp_path, signal.SIGSTOP, timeout_s=6)
    assert "rank 1 on node 1" in error and "no heartbeat" in error
    assert 5 < elapsed < 20
