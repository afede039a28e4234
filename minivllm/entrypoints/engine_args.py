"""The engine options of the command line: one --flag per EngineConfig field, its type taken
from the field's annotation, its help line from FLAG_HELP (and its default from the field),
and the parsed flags back as EngineConfig keyword options."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from typing import Any

from minivllm.config import EngineConfig
from minivllm.spec_decode.config import SpeculativeConfig

# usage_context: set by the command itself (serve: "server"), not a flag.
_SKIP = {"model", "usage_context"}
_SCALARS = (int, float, str)

# One line per EngineConfig field (config.py documents each field; this is its --help form).
# `--help` adds the field's default. A new field needs a line here (tests/entrypoints/test_cli.py).
FLAG_HELP: dict[str, str] = {
    "tokenizer": "tokenizer directory, if not the model's",
    "dtype": "weights and activations; auto: the checkpoint's on CUDA (bfloat16 for float32), "
    "float32 on CPU",
    "device": "auto: CUDA if there is a GPU, else CPU",
    "tensor_parallel_size": "GPUs the model is split over (tensor parallelism)",
    "data_parallel_size": "engine replicas, each on its own tensor-parallel-size GPUs",
    "max_model_len": "longest prompt + output, in tokens; none: the model's "
    "max_position_embeddings",
    "max_num_seqs": "most requests in one step; none: from the device's memory",
    "max_num_batched_tokens": "most tokens in one step; none: from the device's memory",
    "block_size": "tokens per KV-cache block (a power of two)",
    "gpu_memory_utilization": "fraction of the GPU's memory the engine may use (weights, "
    "activations, KV cache)",
    "enable_prefix_caching": "reuse the KV cache of shared prompt prefixes",
    "enforce_eager": "no CUDA graphs",
    "load_format": "dummy: random weights of the right shapes (benchmarks, no checkpoint)",
    "seed": "the engine's random seed (dummy weights, unseeded sampling)",
    "attention_backend": "auto: triton on CUDA, torch_sdpa on CPU",
    "prefill_attention_kernel": "the triton backend's prefill kernel; auto: Gluon (FA3-style) "
    "on Hopper with a bf16/fp16 KV cache in large steps, else Triton (deterministic mode: "
    "its batch-invariant pair, same bits)",
    "kv_cache_memory": "KV-cache bytes on the CPU (on CUDA it comes from profiling)",
    "num_gpu_blocks_override": "a fixed number of KV-cache blocks; none: from memory",
    "async_scheduling": "schedule step N+1 while step N runs",
    "max_cuda_graph_batch_size": "largest decode batch captured in a CUDA graph",
    "max_mixed_graph_tokens": "steps with prefill chunks of up to this many tokens replay "
    "piecewise CUDA graphs; 0: eager",
    "deterministic": "batch-invariant numerics: a request's tokens do not depend on its "
    "neighbours (docs/determinism.md)",
    "max_logprobs": "most logprobs or prompt_logprobs a request may ask for; -1: the vocabulary",
    "scheduling_policy": "fcfs: arrival order; priority: by each request's priority (lower "
    "first), the lowest-priority running request preempted first",
    "kv_cache_dtype": "KV-cache storage; fp8 (= fp8_e4m3): half the bytes, twice the blocks",
    "quantization": "weights; none: as the checkpoint's quantization_config says; fp8: block "
    "FP8 (128 x 128), an unquantized checkpoint quantized at load",
    "disable_custom_all_reduce": "tensor parallelism, on: NCCL for every all-reduce; off "
    "(--no-disable-custom-all-reduce): the symmetric-memory all-reduce kernel where it applies",
    "stream_interval": "the server streams a request's tokens once this many have come",
    "grammar_cache_bytes": "bytes of compiled structured-output grammars kept by each engine "
    "core (least recently used evicted first); 0: none kept",
    "nnodes": "machines the tensor-parallel ranks span (docs/serving.md, across nodes)",
    "node_rank": "this machine's index among the nnodes (0: the one that runs the engine)",
    "master_addr": "node 0's address, where every node meets (the rendezvous store)",
    "master_port": "node 0's rendezvous port",
    "distributed_timeout_seconds": "a collective that waits longer than this for a peer fails",
    "speculative_config": 'speculative decoding, as JSON: \'{"method": "ngram", '
    '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\' (docs/speculative_decoding.md)',
    "enable_return_routed_experts": "MoE models: return the experts each token was routed to "
    "(CompletionOutput.routed_experts: [tokens, sparse layers, top_k])",
}


def _argument_options(name: str, hint: Any) -> dict[str, Any]:
    """argparse.add_argument keywords for a field annotated `hint` (X | None parses as X)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(hint) is typing.Literal:
        return {"choices": typing.get_args(hint)}
    if hint in _SCALARS:
        return {"type": hint}
    if hint is SpeculativeConfig:
        return {"type": _json_object, "metavar": "JSON"}
    raise TypeError(f"EngineConfig.{name}: no command-line form for its type {hint!r}")


def _json_object(text: str) -> dict[str, Any]:
    """A flag's JSON object value; argparse reports the ArgumentTypeError's message after the
    flag's name, as a usage error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """One --flag per EngineConfig field (vLLM's names with dashes); unset flags stay None."""
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name in _SKIP:
            continue
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(
            flag,
            default=None,
            help=_help(f),
            **_argument_options(f.name, hints[f.name]),
        )


def _help(f: dataclasses.Field) -> str:
    """The flag's help line and its default (the field's: unset flags stay None)."""
    default = "none" if f.default is None else str(f.default).lower()
    if isinstance(f.default, bool) and f.default:
        default = "on"
    elif isinstance(f.default, bool):
        default = "off"
    text = FLAG_HELP.get(f.name, "")
    return f"{text} (default: {default})".lstrip().replace("%", "%%")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags given on the command line, as EngineConfig keyword options."""
    names = {f.name for f in dataclasses.fields(EngineConfig)} - _SKIP
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
