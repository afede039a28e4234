"""Session fixtures: tiny random checkpoints (with tokenizer) of each supported architecture."""

from __future__ import annotations

import os
import shutil
import sys

# Each pytest-xdist worker, and every process it starts (servers, ranks), gets its share of
# the cores: torch's default of one thread per core in every process oversubscribes them,
# and OpenMP threads that spin while they wait made two workers on the 2-core CI box run
# their tests ~2.5x slower. Set before torch is imported; a value given outside wins.
_NUM_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _NUM_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _NUM_WORKERS)))

import torch  # noqa: E402

# Triton kernels run in the interpreter on a CPU-only machine; this must be set before
# anything imports triton (this file is loaded before every test module).
if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set")
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minivllm.tiny_model import build_tiny_model  # noqa: E402
from tests import interpreter_patching  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    interpreter_patching.install()

TINY_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-qwen3")), "Qwen3ForCausalLM")


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3-MoE: 8 experts, top-2, sparse layers 0 and 2, a dense layer 1."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-qwen3-moe")), "Qwen3MoeForCausalLM")


def _move_hybrid_weights_off_init(out_dir: str) -> str:
    """A hybrid checkpoint's norms, A_log and dt_bias moved off their initial values, so that a
    norm read as w instead of 1 + w (HF initializes them to 0) or a gate's constant left out
    shows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(("A_log", "dt_bias")):
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_qwen3_5_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3.5 (hybrid): Gated DeltaNet layers 0-2, full attention in layer 3 (weights off
    their initial values: _move_hybrid_weights_off_init)."""
    out_dir = build_tiny_model(str(tmp_path_factory.mktemp("tiny-qwen3-5")), "Qwen3_5ForCausalLM")
    return _move_hybrid_weights_off_init(out_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_5_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3.5-MoE: tiny_qwen3_5_dir's layer types, each MLP 8 experts (top-2) and a shared
    expert."""
    out_dir = str(tmp_path_factory.mktemp("tiny-qwen3-5-moe"))
    return _move_hybrid_weights_off_init(build_tiny_model(out_dir, "Qwen3_5MoeForCausalLM"))


def _make_repeating(model_dir: str, out_dir: str) -> str:
    """model_dir with every layer's output projections (attention, Gated DeltaNet, MLP,
    experts) scaled by 0.03: the next token is then mostly a function of the last one, so
    greedy text falls into loops that n-gram drafts predict, yet the context still changes
    some tokens (drafts accepted, and rejected part-way)."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(key in name for key in ("o_proj", "out_proj", "down_proj")):
                param.mul_(0.03)
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def repeating_qwen3_5_dir(tiny_qwen3_5_dir: str, tmp_path_factory) -> str:
    """tiny_qwen3_5_dir made repetitive (_make_repeating): for speculative decoding."""
    return _make_repeating(tiny_qwen3_5_dir, str(tmp_path_factory.mktemp("rep-qwen3-5")))


@pytest.fixture(scope="session")
def repeating_qwen3_5_moe_dir(tiny_qwen3_5_moe_dir: str, tmp_path_factory) -> str:
    """tiny_qwen3_5_moe_dir made repetitive (_make_repeating)."""
    return _make_repeating(tiny_qwen3_5_moe_dir, str(tmp_path_factory.mktemp("rep-qwen3-5-moe")))


@pytest.fixture(scope="session")
def tiny_qwen3_next_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3-Next: tiny_qwen3_5_moe_dir's layers with its Gated DeltaNet in-projections fused
    per key head, and a dense MLP in layer 1."""
    out_dir = str(tmp_path_factory.mktemp("tiny-qwen3-next"))
    return _move_hybrid_weights_off_init(build_tiny_model(out_dir, "Qwen3NextForCausalLM"))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-qwen2")), "Qwen2ForCausalLM")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")), "LlamaForCausalLM")


@pytest.fixture(params=TINY_ARCHITECTURES)
def tiny_model_dir(request: pytest.FixtureRequest) -> str:
    """Each tiny checkpoint in turn (parametrized over the architectures)."""
    fixture = {
        "Qwen3ForCausalLM": "tiny_qwen3_dir",
        "Qwen2ForCausalLM": "tiny_qwen2_dir",
        "LlamaForCausalLM": "tiny_llama_dir",
    }[request.param]
    return request.getfixturevalue(fixture)
