"""Tensor parallelism on the CPU (gloo): TP=2 gives TP=1's tokens and logprobs; two TP LLMs
one after the other; an interrupted step, a step that fails on rank 0 only, a dead worker at
start-up or mid-run: each an error within seconds, no hang, no orphan, and (where the engine
survives) a next generate that works."""

from __future__ import annotations

import os
import signal
import time

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.executor import tp_executor, worker_group

PROMPTS = [{"prompt_token_ids": [5, 17, 42, 99, 3]}, {"prompt_token_ids": list(range(40, 71))}]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
RICH = [
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2, prompt_logprobs=1),
    SamplingParams(
        temperature=0.9, max_tokens=6, ignore_eos=True, seed=7, logprobs=1, logit_bias={5: 2.0}
    ),
]


def make_llm(model_dir: str, tp: int, **options) -> LLM:
    return LLM(
        model_dir, dtype="float32", device="cpu", block_size=4, tensor_parallel_size=tp, **options
    )


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def run(model_dir: str, tp: int, prompts=PROMPTS, params=PARAMS):
    llm = make_llm(model_dir, tp)
    try:
        return llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def on_forward(llm: LLM, action, at_call: int) -> None:
    """Calls action() inside rank 0's forward (before its second layer), on the at_call-th
    forward pass from now."""
    calls = [0]

    def hook(module, args):
        calls[0] += 1
        if calls[0] == at_call:
            action()

    layer = llm.engine.executor.runner.model.attention_layers()[1]
    layer.register_forward_pre_hook(hook)


def test_tp2_matches_tp1_llama(tiny_llama_dir: str) -> None:
    assert tokens(run(tiny_llama_dir, 2)) == tokens(run(tiny_llama_dir, 1))


def test_tp2_logprobs_and_two_llms_in_one_process(tiny_qwen3_dir: str) -> None:
    """Every rank runs the same execute path: prompt_logprobs (extra LM head rows on every
    rank) and seeded sampling with a logit_bias work; a second TP LLM in the same process
    works too."""
    base = run(tiny_qwen3_dir, 1, params=RICH)
    for _ in range(2):
        split = run(tiny_qwen3_dir, 2, params=RICH)
        assert tokens(split) == tokens(base)
        for a, b in zip(split, base):
            assert len(a.outputs[0].logprobs) == len(b.outputs[0].logprobs) == 6
            for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
                assert x.keys() == y.keys()
                assert all(abs(x[t].logprob - y[t].logprob) < 1e-4 for t in x)
        assert split[0].prompt_logprobs is not None
        assert len(split[0].prompt_logprobs) == len(base[0].prompt_logprobs)


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever the suite was
    started with: a background job (`pytest &`) inherits SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_interrupt_mid_step_then_generate_again(tiny_qwen3_dir: str, default_sigint) -> None:
    """A Ctrl-C that lands inside rank 0's forward is held until the step ends (the workers
    are in the same step), then raised; the next generate works."""
    expected = tokens(run(tiny_qwen3_dir, 1))
    llm = make_llm(tiny_qwen3_dir, 2)
    try:
        on_forward(llm, lambda: signal.raise_signal(signal.SIGINT), at_call=3)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        assert tokens(llm.generate(PROMPTS, PARAMS, use_tqdm=False)) == expected
    finally:
        llm.shutdown()


def test_failure_on_rank0_only_is_an_error_not_a_hang(tiny_qwen3_dir, monkeypatch) -> None:
    monkeypatch.setattr(tp_executor, "_STEP_ERROR_WAIT_S", 1.0)
    llm = make_llm(tiny_qwen3_dir, 2)
    pids = [w.pid for w in llm.engine.executor.workers]

    def fail():
        raise ValueError("injected on rank 0")

    on_forward(llm, fail, at_call=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 0 only.*injected"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert time.monotonic() - start < 10
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)


def test_worker_killed_mid_run_raises_within_seconds(tiny_qwen3_dir: str) -> None:
    llm = make_llm(tiny_qwen3_dir, 2)
    worker = llm.engine.executor.workers[0]
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    on_forward(llm, lambda: (os.kill(worker.pid, signal.SIGKILL), worker.wait()), at_call=4)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert time.monotonic() - start < 5
    llm.shutdown()
    assert not any(alive(w.pid) for w in llm.engine.executor.workers)


def test_worker_dead_at_start_fails_llm_at_once(tiny_qwen3_dir, monkeypatch) -> None:
    monkeypatch.setattr(worker_group.sys, "executable", "/bin/false")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1.*exit code 1"):
        make_llm(tiny_qwen3_dir, 2)
    assert time.monotonic() - start < 10


def test_heads_not_divisible_by_tp_is_a_clear_error(tiny_qwen3_dir: str) -> None:
    # The tiny Qwen3 has 4 query heads: 3 ranks cannot split them.
    with pytest.raises(ValueError, match=r"\b4\b.*\b3\b|\b3\b.*\b4\b"):
        LLM(tiny_qwen3_dir, dtype="float32", device="cpu", tensor_parallel_size=3)
