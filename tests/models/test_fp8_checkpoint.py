"""Block-FP8 checkpoints (Qwen's `fp8` layout, compressed-tensors' block FP8) and `quantization=
"fp8"` on an unquantized one: they load, and their outputs stay close to the same weights
dequantized to float32 (the only difference left: activations quantized per token-group)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from minivllm import LLM, SamplingParams
from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.config import EngineConfig
from minivllm.engine.setup import resolve_setup
from minivllm.layers.ops import LayerOps
from minivllm.model_loader import build_model
from minivllm.models.model_config import ModelConfig
from minivllm.tiny_model import build_tiny_model, make_dummy_model_dir
from tests.fp8_checkpoint import (
    COMPRESSED_TENSORS_FP8,
    FP8_MOE_SIZES,
    FP8_SIZES,
    QWEN_FP8,
    w8a8_emulation,
    write_fp8_checkpoints,
)
from tests.helpers import prefill_logits

# Teacher-forced over the prompts below (112 positions of a random tiny model, whose top two
# logits are often close): next-token top-1 agreement with the dequantized model, every position
# whose reference margin exceeds CLEAR_MARGIN agreeing, and the error of the reference token's
# logprob (nats), mean and max. Measured: 0.87-1.0 agreement (disagreements at margins < 0.16),
# mean error 0.05-0.08, max 0.32.
MIN_TOP1 = 0.8
CLEAR_MARGIN = 0.25
MAX_MEAN_LOGPROB_ERROR = 0.12
MAX_LOGPROB_ERROR = 0.5


@pytest.fixture(scope="module")
def fp8_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fp8")
    src = build_tiny_model(str(root / "src"), "Qwen3ForCausalLM", **FP8_SIZES)
    dirs = {"src": src}
    moe = build_tiny_model(str(root / "moe_src"), "Qwen3MoeForCausalLM", **FP8_MOE_SIZES)
    dirs["moe_src"] = moe
    for name, layout, source in (
        ("fp8", QWEN_FP8, src), ("ct", COMPRESSED_TENSORS_FP8, src), ("moe", QWEN_FP8, moe),
    ):  # fmt: skip
        dirs[name], dirs[f"{name}_ref"] = str(root / name), str(root / f"{name}_ref")
        write_fp8_checkpoints(source, dirs[name], dirs[f"{name}_ref"], layout)
    return dirs


def prompts(vocab_size: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in (9, 33, 70)]


def load(model_dir: str, quantization: str | None = None):
    """The model as the engine builds it: the option resolved against the checkpoint."""
    setup = resolve_setup(
        EngineConfig(model=model_dir, device="cpu", quantization=quantization),
        ModelConfig.from_hf(model_dir),
    )
    return build_model(
        setup.model_config, TorchSDPABackend(), torch.float32, "cpu", model_dir,
        quant=setup.quantization,
    )  # fmt: skip


def assert_close_outputs(model, ref, vocab_size: int) -> None:
    ours = torch.cat(prefill_logits(model, prompts(vocab_size)))
    theirs = torch.cat(prefill_logits(ref, prompts(vocab_size)))
    ref_tokens = theirs.argmax(-1)
    agree = ours.argmax(-1) == ref_tokens
    top2 = theirs.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > CLEAR_MARGIN
    lp_ours = ours.log_softmax(-1).gather(-1, ref_tokens[:, None])
    lp_ref = theirs.log_softmax(-1).gather(-1, ref_tokens[:, None])
    error = (lp_ours - lp_ref).abs()
    assert agree.float().mean() >= MIN_TOP1, agree.float().mean()
    assert agree[clear].all() and clear.sum() > len(clear) // 2
    assert error.mean() <= MAX_MEAN_LOGPROB_ERROR and error.max() <= MAX_LOGPROB_ERROR, error


@pytest.mark.parametrize("layout", ["fp8", "ct", "moe"])
def test_fp8_checkpoint_computes_w8a8_of_its_dequantized_weights(fp8_dirs, layout: str) -> None:
    """Dense (both layouts) and mixture of experts (FP8 experts, the router unquantized)."""
    model = load(fp8_dirs[layout])
    vocab, lm_head_rows = model.config.vocab_size, model.lm_head.weight.shape[0]
    num_experts = model.config.moe.num_experts if model.config.moe else 0
    # o_proj, down_proj; qkv_proj, gate_up_proj; an expert's gate_up
    assert not {lm_head_rows, num_experts} & {128, 768, 256}
    emulated = build_model(
        ModelConfig.from_hf(fp8_dirs[f"{layout}_ref"]), TorchSDPABackend(), torch.float32,
        "cpu", fp8_dirs[f"{layout}_ref"],
        ops=LayerOps(gemm=w8a8_emulation(lm_head_rows, num_experts)),
    )  # fmt: skip
    for ours, theirs in zip(
        prefill_logits(model, prompts(vocab)),
        prefill_logits(emulated, prompts(vocab)),
        strict=True,
    ):
        torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", ["fp8", "ct"])
def test_fp8_checkpoint_matches_its_dequantized_weights(fp8_dirs, layout: str) -> None:
    model = load(fp8_dirs[layout])
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn
    scale_name = "weight_scale_inv" if layout == "fp8" else "weight_scale"
    assert getattr(qkv, scale_name).shape == (6, 1)  # 768 rows, 128 columns
    down = model.model.layers[0].mlp.down_proj
    assert getattr(down, scale_name).shape == (1, 3)  # 128 rows, 384 columns
    ref = load(fp8_dirs[f"{layout}_ref"])
    assert ref.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    assert_close_outputs(model, ref, model.config.vocab_size)


@pytest.mark.parametrize("src,ckpt", [("src", "fp8"), ("moe_src", "moe")])
def test_quantize_at_load_matches_the_checkpoint(fp8_dirs, src: str, ckpt: str) -> None:
    """quantization="fp8" on the float32 checkpoint gives the FP8 checkpoint's weights."""
    at_load, from_ckpt = load(fp8_dirs[src], "fp8"), load(fp8_dirs[ckpt])
    for (name, a), (_, b) in zip(
        at_load.named_parameters(), from_ckpt.named_parameters(), strict=True
    ):
        assert a.dtype == b.dtype, name
        assert torch.equal(a.float(), b.float()), name


def test_greedy_tokens_match_the_dequantized_model(fp8_dirs) -> None:
    """Short greedy continuations through the engine: the first two tokens equal on every
    prompt, the whole four on at least half (a random tiny model has near-ties that the
    activations' rounding flips once a continuation differs; measured: 5 of 8 whole)."""
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    texts = [
        "Hello there", "The quick brown fox", "1 2 3 4", "Once upon a time", "def main():",
        "a b c", "It was the best of times", "print('hi')",
    ]  # fmt: skip
    runs = []
    for model_dir in (fp8_dirs["fp8"], fp8_dirs["fp8_ref"]):
        llm = LLM(model_dir, device="cpu", enforce_eager=True, seed=0)
        runs.append([o.outputs[0].token_ids for o in llm.generate(texts, params, use_tqdm=False)])
        llm.shutdown()
    assert all(a[:2] == b[:2] for a, b in zip(*runs, strict=True)), runs
    assert sum(a == b for a, b in zip(*runs, strict=True)) >= len(texts) // 2, runs


def test_a_dummy_directory_says_fp8_as_qwens_fp8_checkpoints_do(tmp_path) -> None:
    """make_dummy_model_dir(..., quantization="fp8"): the benchmarks' FP8 weights beside vLLM
    (both engines read config.json's quantization_config and load dummy weights in it)."""
    model_dir = make_dummy_model_dir("qwen3-8b", str(tmp_path / "fp8"), quantization="fp8")
    with open(f"{model_dir}/config.json") as f:
        assert json.load(f)["quantization_config"] == QWEN_FP8
    quantization = ModelConfig.from_hf(model_dir).quantization
    assert quantization.method == "fp8" and not quantization.quantize_at_load
    hybrid = make_dummy_model_dir("qwen3.5-9b", str(tmp_path / "hybrid"), quantization="fp8")
    with open(f"{hybrid}/config.json") as f:
        kept = json.load(f)["quantization_config"]["modules_to_not_convert"]
    # Each Gated DeltaNet layer's b and a projections, by the checkpoint's own module names.
    assert len(kept) == 2 * 24 and ModelConfig.from_hf(hybrid).quantization.ignored == tuple(kept)
    with torch.device("meta"):
        names = {n for n, _ in AutoModelForImageTextToText.from_config(
            AutoConfig.from_pretrained(hybrid)).named_modules()}  # fmt: skip
    assert set(kept) <= names, sorted(set(kept) - names)[:3]
    plain = make_dummy_model_dir("qwen3-8b", str(tmp_path / "bf16"))
    assert ModelConfig.from_hf(plain).quantization is None
    with pytest.raises(ValueError, match="quantization must be None or 'fp8'"):
        make_dummy_model_dir("qwen3-8b", str(tmp_path / "awq"), quantization="awq")
