"""torchrun across two "nodes" on loopback: `torchrun --nnodes 2 --node-rank R --nproc-per-node 1
--master-addr 127.0.0.1 --master-port P script.py`, once per node, so that RANK (0, 1) and
LOCAL_RANK (0 on both) differ. Every rank returns TP=1's greedy tokens and both launches exit 0
by themselves; a rank of node 1 killed mid-run makes node 0's launch fail within seconds, its
error naming rank 1 on node 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from minivllm import LLM, SamplingParams
from minivllm.engine.executor.tp_executor import free_port

PROMPTS = [[5, 17, 42, 99, 3], list(range(40, 71))]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from minivllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], dtype="float32", device="cpu", block_size=4, tensor_parallel_size=2,
              distributed_timeout_seconds=30)
    params = SamplingParams(temperature=0.0, max_tokens=int(sys.argv[3]), ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in json.loads(sys.argv[2])]
    os.write(1, f"PID {os.getpid()}\\n".encode())
    outs = llm.generate(prompts, params, use_tqdm=False)
    ids = [o.outputs[0].token_ids for o in outs]
    ranks = os.environ["RANK"] + " " + os.environ["LOCAL_RANK"]
    os.write(1, f"TOKENS {ranks} {json.dumps(ids)}\\n".encode())
    llm.shutdown()
    """
)


def launch(script, node: int, port: int, model_dir: str, max_tokens: int, log):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
        "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
        str(script), model_dir, json.dumps(PROMPTS), str(max_tokens),
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def finish(procs, timeout: float) -> list[int | None]:
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes.append(None)
    return codes


def test_torchrun_two_nodes_match_tp1(tiny_qwen3_dir: str, tmp_path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    port = free_port()
    logs = [tmp_path / f"node{n}.log" for n in range(2)]
    with open(logs[0], "w") as log0, open(logs[1], "w") as log1:
        procs = [
            launch(script, n, port, tiny_qwen3_dir, 8, log) for n, log in enumerate((log0, log1))
        ]
        codes = finish(procs, timeout=120)
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], text
    lines = [
        line.split(" ", 3) for t in text for line in t.splitlines() if line.startswith("TOKENS")
    ]
    assert sorted((rank, local) for _, rank, local, _ in lines) == [("0", "0"), ("1", "0")]
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    llm.shutdown()
    expected = [o.outputs[0].token_ids for o in outs]
    assert all(json.loads(ids) == expected for *_, ids in lines)


def test_torchrun_node1_rank_killed_fails_node0_fast(tiny_qwen3_dir: str, tmp_path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    port = free_port()
    logs = [tmp_path / f"node{n}.log" for n in range(2)]
    with open(logs[0], "w") as log0, open(logs[1], "w") as log1:
        procs = [
            launch(script, n, port, tiny_qwen3_dir, 400, log) for n, log in enumerate((log0, log1))
        ]
        deadline = time.monotonic() + 120
        while "PID" not in logs[1].read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # mid-run: generating
        rank1 = int(logs[1].read_text().split("PID ")[1].split()[0])
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        codes = finish(procs, timeout=60)
        elapsed = time.monotonic() - killed
    text = [log.read_text() for log in logs]
    tails = "\n".join(f"--- node {n}, exit {codes[n]}:\n{t[-2500:]}" for n, t in enumerate(text))
    assert codes[0] not in (0, None) and codes[1] not in (0, None), tails
    # far below the 30 s collective timeout
    assert elapsed < 20, f"node 0 failed {elapsed:.1f} s after the kill\n{tails}"
    assert "rank 1 on node 1" in text[0], text[0][-3000:]  # named by the heartbeats
