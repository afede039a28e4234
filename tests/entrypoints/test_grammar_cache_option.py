"""--grammar-cache-bytes (EngineConfig.grammar_cache_bytes): the flag reaches the engine's
compile cache (which also compiles the frontend's checks), the bound acts there, and a bad value
is an error naming the flag before any model loads."""

from __future__ import annotations

import argparse
import re

import pytest

from minivllm import LLM, SamplingParams
from minivllm.config import EngineConfig
from minivllm.entrypoints import cli
from minivllm.entrypoints.engine_args import add_engine_options, engine_options
from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.compiler import DEFAULT_CACHE_BYTES
from minivllm.structured_output.manager import shared_compiler

REGEX = r"(yes|no)-[0-9]{3}"


def _options(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    return engine_options(parser.parse_args(list(argv)))


def _cache_info_after_a_constrained_request(model_dir: str, *argv: str):
    llm = LLM(
        model_dir, device="cpu", dtype="float32", num_gpu_blocks_override=64, **_options(*argv)
    )
    try:
        params = SamplingParams(
            max_tokens=8, temperature=0.0, structured_outputs=StructuredOutputsParams(regex=REGEX)
        )
        (out,) = llm.generate(["hello there"], params, use_tqdm=False)
        assert re.fullmatch(REGEX, out.outputs[0].text) or out.outputs[0].finish_reason == "length"
        bound = llm.config.grammar_cache_bytes
        # The process's compiler for this tokenizer, vocabulary and bound: the engine's, which
        # compiled both the frontend's check and the request.
        compiler = shared_compiler(
            llm.config.resolved_tokenizer(), llm.engine.info.vocab_size, bound
        )
        return bound, compiler.cache_info()
    finally:
        llm.shutdown()


def test_the_flag_bounds_the_cache_of_the_engine_and_its_frontend(tiny_qwen3_dir: str) -> None:
    bound, info = _cache_info_after_a_constrained_request(
        tiny_qwen3_dir, "--grammar-cache-bytes", "0"
    )
    assert bound == 0
    # Used by both (the frontend's check, then the core's compile: nothing kept, so a miss
    # each), and the bound held: nothing is kept.
    assert info.misses >= 2 and info.size == 0 and info.num_bytes == 0

    bound, info = _cache_info_after_a_constrained_request(tiny_qwen3_dir)
    assert bound == DEFAULT_CACHE_BYTES  # the config's default is the compiler's
    # (Other tests in this process may have filled the same compiler's cache before.)
    assert info.size >= 1 and 0 < info.num_bytes <= bound
    assert info.hits >= 1  # the core's compile found the frontend's


def test_a_negative_bound_names_the_flag(tiny_qwen3_dir: str, capsys) -> None:
    with pytest.raises(ValueError, match="--grammar-cache-bytes"):
        EngineConfig(tiny_qwen3_dir, device="cpu", grammar_cache_bytes=-1)
    argv = ["generate", "--model", tiny_qwen3_dir, "--device", "cpu"]
    assert cli.main([*argv, "--grammar-cache-bytes", "-1"]) == 2
    assert (
        "grammar_cache_bytes (--grammar-cache-bytes) must be >= 0, got -1"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as usage_error:  # argparse's: not a number
        cli.main([*argv, "--grammar-cache-bytes", "lots"])
    assert usage_error.value.code == 2
    assert "--grammar-cache-bytes" in capsys.readouterr().err
