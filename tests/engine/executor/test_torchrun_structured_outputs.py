"""Structured outputs under torchrun: every rank runs the whole engine, so each fills its own
masks from its own matchers; the ranks agree step by step (a compile is awaited on arrival,
so no rank admits a request a step before another, even with rank 1's grammar backend
slower to come) and return TP=1's tokens, valid."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import jsonschema

from minivllm import LLM
from tests.engine.executor.test_tp_structured_outputs import (
    JSON_SEEDED,
    PLAIN_GREEDY,
    PROMPTS,
    REGEX,
    REGEX_GREEDY,
    SCHEMA,
)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from minivllm import LLM, SamplingParams
    from minivllm.structured_output import StructuredOutputsParams, manager
    schema, regex, prompts = json.loads(sys.argv[2])
    if os.environ["RANK"] == "1":  # the engine's grammar backend comes later on rank 1
        shared = manager.shared_compiler
        manager.shared_compiler = lambda *args: (time.sleep(0.5), shared(*args))[1]
    llm = LLM(sys.argv[1], dtype="float32", device="cpu", block_size=4, tensor_parallel_size=2)
    params = [
        SamplingParams(temperature=1.0, seed=3, max_tokens=40,
                       structured_outputs=StructuredOutputsParams(json=schema)),
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40,
                       structured_outputs=StructuredOutputsParams(regex=regex)),
    ]
    for _ in range(2):  # a second call: its compiles are cache hits, the ranks still agree
        outs = llm.generate(prompts, params, use_tqdm=False)
        line = "TOKENS " + json.dumps([o.outputs[0].token_ids for o in outs]) + "\\n"
        os.write(1, line.encode())  # one write: the two ranks share stdout
    llm.shutdown()
    """
)


def test_torchrun_tp2_constrained_matches_single_process(tiny_qwen3_dir: str, tmp_path) -> None:
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
        json.dumps([SCHEMA, REGEX, PROMPTS]),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("TOKENS")]
    assert len(lines) == 4 and len(set(lines)) == 1  # every rank, every call: the same
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)
    try:
        params = [JSON_SEEDED, PLAIN_GREEDY, REGEX_GREEDY]
        outs = [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    finally:
        llm.shutdown()
    assert json.loads(lines[0][len("TOKENS ") :]) == [o.token_ids for o in outs]
    schema = {k: v for k, v in SCHEMA.items() if k != "x-guidance"}
    jsonschema.validate(json.loads(outs[0].text), schema)
    assert re.fullmatch(REGEX, outs[2].text)
