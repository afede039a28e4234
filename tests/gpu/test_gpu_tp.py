"""GPU tensor and data parallelism (NCCL, CUDA graphs with the all-reduce captured, async
scheduling): TP=2/4 and DP=2 give TP=1's greedy tokens on the random Qwen3-0.6B-shaped model;
each LLM starts, runs and stops within a minute and leaves no process behind."""

from __future__ import annotations

import gc
import json
import time

import pytest
import torch

from tests.gpu.conftest import prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def greedy(model_dir: str, tp: int = 1, dp: int = 1, **options) -> list[list[int]]:
    from minivllm import LLM, SamplingParams

    start = time.monotonic()
    llm = LLM(
        model_dir,
        dtype="bfloat16",
        gpu_memory_utilization=0.3,
        max_model_len=4096,
        max_cuda_graph_batch_size=32,  # a short capture ladder: the test is about parity
        tensor_parallel_size=tp,
        data_parallel_size=dp,
        **options,
    )
    try:
        batch = [{"prompt_token_ids": p} for p in prompts(8, 120, seed=3)]
        params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
        return [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        assert time.monotonic() - start < 60, f"tp={tp} dp={dp} took {time.monotonic() - start}"


@pytest.fixture(scope="module")
def base(model_dir: str) -> list[list[int]]:
    return greedy(model_dir)


def common_prefix(base: list[list[int]], other: list[list[int]]) -> float:
    fractions = []
    for a, b in zip(base, other):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        fractions.append(n / len(a))
    return sum(fractions) / len(fractions)


@pytest.mark.parametrize("tp,dp", [(2, 1), (4, 1), (1, 2), (2, 2)])
def test_parallel_matches_single_gpu(model_dir: str, base, tp: int, dp: int) -> None:
    if torch.cuda.device_count() < tp * dp:
        pytest.skip(f"needs {tp * dp} GPUs")
    other = greedy(model_dir, tp=tp, dp=dp)
    fraction = common_prefix(base, other)
    print("GPU-PARALLEL", json.dumps({"tp": tp, "dp": dp, "common_prefix_fraction": fraction}))
    # bf16: all-reduces sum in another order than one GPU's GEMM, and a replica's smaller
    # batch may pick other GEMM tiles; allow late divergence only.
    assert fraction >= 0.9


def test_tp2_eager_and_sync_scheduling(model_dir: str, base) -> None:
    """The other two execute paths (no CUDA graphs; synchronous steps) under TP=2."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    other = greedy(model_dir, tp=2, enforce_eager=True, async_scheduling=False)
    assert common_prefix(base, other) >= 0.9


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_tp2_speculative_decoding(model_dir: str, base, method: str) -> None:
    """Speculative decoding under TP=2 (async scheduling: draft slots filled by rank 0 before
    the step travels): n-gram, and the draft model (here the target itself) whole on rank 0."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    if method == "draft_model":
        spec = {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 3}
    other = greedy(model_dir, tp=2, speculative_config=spec)
    assert common_prefix(base, other) >= 0.9


_GREEDY_SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from tests.gpu.test_gpu_tp import greedy
print("TOKENS", json.dumps(greedy(sys.argv[1], tp=2, disable_custom_all_reduce=sys.argv[2] == "1")))
"""


def _greedy_tp2_fresh(model_dir: str, disable: bool) -> tuple[list[list[int]], str]:
    """greedy(tp=2) in a fresh process: torch sets symmetric memory up once per process."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _GREEDY_SCRIPT, model_dir, str(int(disable))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("TOKENS "))
    return json.loads(line[len("TOKENS ") :]), proc.stderr


def test_tp2_custom_all_reduce_gives_nccl_tokens(model_dir: str) -> None:
    """At two ranks the symmetric-memory one-shot sum has NCCL's bits (a + b = b + a), so
    TP=2 with it and with NCCL only must agree token for token."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    with_symm, log = _greedy_tp2_fresh(model_dir, disable=False)
    assert "all-reduce: symmetric memory" in log, log[-3000:]
    nccl_only, _ = _greedy_tp2_fresh(model_dir, disable=True)
    assert with_symm == nccl_only


def _all_reduce_rank(rank: int, init_method: str, queue) -> None:
    import datetime

    import torch.distributed as dist

    from minivllm.distributed.all_reduce import TPAllReduce, create_symm_buffer

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=2,
                            timeout=timeout, device_id=device)  # fmt: skip
    result = {}
    try:
        symm = create_symm_buffer(device)
        result["symm"] = symm is not None
        if symm is not None:
            reduce = TPAllReduce(symm, fallback=None)
            gen = torch.Generator(device=device).manual_seed(rank)
            for rows in (1, 7, 256, 1024):  # 8 KB .. 8 MB of bf16 at hidden 4096
                x = torch.randn(rows, 4096, generator=gen, device=device).to(torch.bfloat16)
                expected = x.clone()
                dist.all_reduce(expected)
                graph = torch.cuda.CUDAGraph()
                reduce(x, 2)  # warm-up before capture
                with torch.cuda.graph(graph):
                    captured = reduce(x, 2)
                graph.replay()
                result[rows] = [
                    torch.equal(reduce(x, 2), expected),
                    torch.equal(symm.two_shot(x), expected),
                    torch.equal(captured, expected),
                ]
    finally:
        queue.put((rank, result))
        dist.destroy_process_group()


def test_symm_mem_all_reduce_equals_nccl_eager_and_in_graphs() -> None:
    """The one-shot and two-shot kernels give NCCL's bits at two ranks, eagerly and replayed
    from a CUDA graph; creating the buffer works on this machine (else the engine falls back
    to NCCL and this test says why in the log)."""
    import multiprocessing as mp

    from minivllm.engine.executor.tp_executor import free_port

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_all_reduce_rank, args=(r, init_method, queue)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    print("GPU-SYMM-ALL-REDUCE", results)
    assert all(proc.exitcode == 0 for proc in procs)
    for rank in (0, 1):
        assert results[rank]["symm"], "symmetric memory unavailable: engine uses NCCL only"
        for rows in (1, 7, 256, 1024):
            assert results[rank][rows] == [True, True, True], (rank, rows)
