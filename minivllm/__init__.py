"""minivllm: a compact, fast, readable LLM inference engine with its own Triton kernels."""

from minivllm.config import EngineConfig
from minivllm.entrypoints.llm import LLM
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig"]
