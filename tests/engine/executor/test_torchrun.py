"""The same engine under torchrun: every rank runs the script and the whole engine in lockstep
(no broadcast), every rank returns the same tokens, equal to a single-process run (gloo on the
CPU; across nodes only the launch differs), and every rank exits by itself."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from minivllm import LLM, SamplingParams

PROMPTS = [[5, 17, 42, 99, 3], list(range(40, 71))]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from minivllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], dtype="float32", device="cpu", block_size=4, tensor_parallel_size=2)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for _ in range(2):  # a second call: the ranks still agree
        prompts = [{"prompt_token_ids": p} for p in json.loads(sys.argv[2])]
        outs = llm.generate(prompts, params, use_tqdm=False)
        line = "TOKENS " + json.dumps([o.outputs[0].token_ids for o in outs]) + "\\n"
        os.write(1, line.encode())  # one write: the two ranks share stdout
    llm.shutdown()
    """
)


def test_torchrun_tp2_matches_single_process(tiny_qwen3_dir: str, tmp_path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        tiny_qwen3_dir,
        json.dumps(PROMPTS),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("TOKENS")]
    assert len(lines) == 4 and len(set(lines)) == 1  # every rank, every call: the same
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert json.loads(lines[0][len("TOKENS ") :]) == [o.outputs[0].token_ids for o in outs]
