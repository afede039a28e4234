"""The engine's kernel warm-up (engine/warm_up.py; run at start on CUDA) leaves no trace:
run by hand on the CPU engine, the next outputs, unseeded sampling included, are those of an
engine that never warmed up, and the runner holds no state of the warm-up requests."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.attention.triton import GLUON_MIN_STEP_TOKENS
from minivllm.engine.warm_up import warm_up


def outputs(llm: LLM) -> list[list[int]]:
    # The CPU sampler's top-p/top-k path draws unseeded rows from torch's global RNG, which
    # anything in the process moves; the engine's own step generator is what is checked.
    torch.manual_seed(0)
    prompts = [
        {"prompt_token_ids": [(5 * i + j) % 90 + 3 for j in range(9 + 7 * i)]} for i in range(4)
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6),
        SamplingParams(temperature=1.0, max_tokens=6),
    ]
    outs = llm.generate(prompts * 2, [params[0]] * 4 + [params[1]] * 4, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_warm_up_leaves_no_trace(tiny_qwen3_dir: str, async_scheduling: bool) -> None:
    options = dict(dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=512,
                   max_num_batched_tokens=256, async_scheduling=async_scheduling)  # fmt: skip
    expected = outputs(LLM(tiny_qwen3_dir, **options))
    llm = LLM(tiny_qwen3_dir, **options)
    core = llm.engine
    vocab_size = core.setup.model_config.vocab_size
    steps = warm_up(core.new_scheduler(), core.run_step, vocab_size,
                    core.setup.max_model_len, core.num_blocks * 4)  # fmt: skip
    assert steps >= 3
    assert core.executor.runner.sampling_state.requests == {}
    assert core.stats().prefix_cache_queries == 0
    assert outputs(llm) == expected


def test_warm_up_ends_on_a_small_cache(tiny_qwen3_dir: str) -> None:
    llm = LLM(
        tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=12
    )
    core = llm.engine
    steps = warm_up(core.new_scheduler(), core.run_step,
                    core.setup.model_config.vocab_size, core.setup.max_model_len, 48)  # fmt: skip
    assert 3 <= steps < 100 and core.executor.runner.sampling_state.requests == {}


def warm_up_steps(llm: LLM, block_size: int) -> list:
    """Runs the warm-up on llm's engine; returns the SchedulerOutput of each of its steps."""
    core, setup = llm.engine, llm.engine.setup
    seen = []

    def run_step(scheduler):
        sched_out, outputs = core.run_step(scheduler)
        seen.append(sched_out)
        return sched_out, outputs

    warm_up(core.new_scheduler(), run_step, setup.model_config.vocab_size,
            setup.max_model_len, core.num_blocks * block_size)  # fmt: skip
    return seen[:-1]  # the last: the empty step that hands the finished ids to the runner


def test_warm_up_reaches_every_step_shape(tiny_qwen3_dir: str) -> None:
    """The step shapes whose kernels compile on first use (warm_up's docstring): a first step as
    large as a step gets, at a token count off the multiples of 16, sampled greedily by the
    plain pass; a filtered random row; a prefill beside decodes."""
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4,
              num_gpu_blocks_override=104, max_num_batched_tokens=256)  # fmt: skip
    seen = warm_up_steps(llm, block_size=4)
    first = seen[0]
    assert first.num_tokens == 207  # min(256, KV capacity / 2 = 208), less one: 208 % 16 == 0
    assert len(first.new_requests) > 1  # prompts of at most a quarter of the KV cache
    assert all(r.sampling_params.temperature == 0.0 for r in first.new_requests)
    new = [r.sampling_params for s in seen for r in s.new_requests]
    assert any(p.temperature > 0 and p.top_k > 0 for p in new)
    assert any(0 < s.num_decode_chunks < len(s.chunks) for s in seen)
    # A mid-size prefill: two prompts of the longest warm-up length (here a quarter of the KV
    # cache, less 3) in one step.
    assert any([len(r.prompt_token_ids) for r in s.new_requests] == [101, 101] for s in seen)


def test_warm_up_runs_a_large_step_of_a_few_prompts(tiny_qwen3_dir: str) -> None:
    """Where a step can hold GLUON_MIN_STEP_TOKENS, a step past it made of a few prompts (on
    Hopper the Gluon kernel with fewer programs than a wave), besides the first, larger one."""
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=16,
              num_gpu_blocks_override=1024, max_num_batched_tokens=8192)  # fmt: skip
    seen = warm_up_steps(llm, block_size=16)
    longest = llm.engine.setup.max_model_len - 8  # 504: below 1,000 and a quarter of the cache
    assert seen[0].num_tokens == 8191 and len(seen[0].new_requests) == 17
    large = [s for s in seen[1:] if s.num_tokens >= GLUON_MIN_STEP_TOKENS]
    assert len(large) == 1
    prompts = [len(r.prompt_token_ids) for r in large[0].new_requests]
    assert prompts == [longest] * (GLUON_MIN_STEP_TOKENS // longest + 1)


def test_late_compiles_are_logged_and_chain_the_hook_set_before(caplog) -> None:
    import logging

    from triton import knobs

    from minivllm.kernels.late_compiles import log_late_compiles

    seen = []
    saved = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kwargs: seen.append(kwargs["repr"])
    try:
        assert log_late_compiles(logging.getLogger("late-compile-test"))
        with caplog.at_level(logging.WARNING, logger="late-compile-test"):
            # What Triton's JIT passes after compiling a kernel variant (keywords only).
            knobs.runtime.jit_post_compile_hook(
                key="k", repr="_decode_kernel[num_warps=4](num_splits: 16)", fn=None,
                compile={}, is_manual_warmup=False, already_compiled=False,
            )  # fmt: skip
    finally:
        knobs.runtime.jit_post_compile_hook = saved
    assert seen == ["_decode_kernel[num_warps=4](num_splits: 16)"]
    assert "Triton compiled _decode_kernel[num_warps=4] after the warm-up" in caplog.text
    assert caplog.text.rstrip().endswith("specialization k")
    assert caplog.records[0].levelno == logging.WARNING


def _compile_event(hook, name: str) -> None:
    """What Triton's JIT passes to its post-compile hook (keywords only)."""
    hook(key="k", repr=f"{name}[num_warps=4](x: 1)", fn=None, compile={},
         is_manual_warmup=False, already_compiled=False)  # fmt: skip


def test_one_late_compile_hook_per_process_paused_while_an_engine_starts(caplog) -> None:
    # Several engines in one process (notebooks, the GPU option matrix): a second engine adds
    # no second hook (every compile would be logged twice), and its own start-up compiles are
    # not "late" although the first engine's hook is set.
    import logging

    from triton import knobs

    from minivllm.kernels.late_compiles import engine_starting, log_late_compiles

    seen = []
    saved = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kwargs: seen.append(kwargs["repr"])
    log = logging.getLogger("late-compile-test")
    try:
        with engine_starting():  # no hook of ours yet: nothing to pause
            pass
        assert log_late_compiles(log)
        first = knobs.runtime.jit_post_compile_hook
        assert log_late_compiles(log)  # the second engine
        assert knobs.runtime.jit_post_compile_hook is first
        with caplog.at_level(logging.WARNING, logger="late-compile-test"):
            with engine_starting():
                with engine_starting():  # nested (an engine built while another starts)
                    _compile_event(first, "_starting_kernel")
                _compile_event(first, "_still_starting_kernel")
            _compile_event(first, "_late_kernel")
    finally:
        knobs.runtime.jit_post_compile_hook = saved
    names = ("_starting_kernel", "_still_starting_kernel", "_late_kernel")
    assert seen == [f"{name}[num_warps=4](x: 1)" for name in names]  # the chained hook: all
    assert [r.getMessage().split(" after")[0] for r in caplog.records] == [
        "Triton compiled _late_kernel[num_warps=4]"
    ]
