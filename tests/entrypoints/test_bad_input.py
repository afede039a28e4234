"""Bad input gets a clear error naming the problem, and the same LLM keeps serving."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import warnings

import pytest

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str) -> LLM:
    return LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        block_size=4,
        max_model_len=64,
        num_gpu_blocks_override=12,
    )


def still_serves(llm: LLM) -> None:
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, GREEDY, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.num_blocks


def test_prompt_too_long(llm: LLM) -> None:
    with pytest.raises(ValueError, match="context length is 64 tokens, and the prompt has 70"):
        llm.generate({"prompt_token_ids": [1] * 70}, GREEDY, use_tqdm=False)
    still_serves(llm)


def test_empty_prompt(llm: LLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", GREEDY, use_tqdm=False)
    still_serves(llm)


def test_text_that_is_not_unicode(llm: LLM) -> None:
    """A lone surrogate is a Python str but no UTF-8: a ValueError naming it, not the
    tokenizer's TypeError."""
    for prompt in ("a\ud800b", {"prompt": "\udcff"}):
        with pytest.raises(ValueError, match="not valid Unicode"):
            llm.generate(prompt, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="not valid Unicode"):
        llm.chat([{"role": "user", "content": "hi \ud800"}], GREEDY, use_tqdm=False)
    still_serves(llm)


def test_token_outside_vocab(llm: LLM) -> None:
    vocab = llm.engine.info.vocab_size
    with pytest.raises(ValueError, match=str(vocab + 5)):
        llm.generate(
            [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [1, vocab + 5]}],
            GREEDY,
            use_tqdm=False,
        )
    with pytest.raises(ValueError, match="-1"):
        llm.generate({"prompt_token_ids": [-1]}, GREEDY, use_tqdm=False)
    still_serves(llm)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        # Values that used to be accepted and then failed the whole step (or gave nonsense).
        ({"seed": 2**70}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": 2**70}, "top_k"),
        ({"max_tokens": 2**70}, "max_tokens"),
        ({"stop_token_ids": [2**70]}, "stop_token_ids"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"n": 10**9}, "n must be"),
    ],
)
def test_invalid_sampling_params(kwargs, words) -> None:
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"temperature": "0.5"}, "temperature"),
        ({"n": 2.0}, "n"),
        ({"top_k": True}, "top_k"),
        ({"seed": 1.5}, "seed"),
        ({"stop": ["ok", 3]}, "stop"),
        ({"stop_token_ids": ["3"]}, "stop_token_ids"),
    ],
)
def test_wrong_types_in_sampling_params(kwargs, words) -> None:
    with pytest.raises(TypeError, match=words):
        SamplingParams(**kwargs)


def test_extreme_seeds_run(llm: LLM) -> None:
    """The whole int64 range works, n > 1 included (samples use seed + index); -1 is unseeded."""
    assert SamplingParams(seed=-1).seed is None
    for seed in (2**63 - 1, -(2**63)):
        params = SamplingParams(n=2, seed=seed, temperature=1.0, max_tokens=3)
        out = llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False)
        assert [len(c.token_ids) for c in out[0].outputs] == [3, 3]
    still_serves(llm)


def test_tiny_temperature_is_raised_to_vllms_floor(caplog) -> None:
    """As in vLLM, a temperature in (0, 0.01) becomes 0.01 with a warning: below it float32
    logits / temperature overflow (1e-40 gave NaN probabilities and token 0 every step) or
    the temperature itself rounds to a float32 0 (1e-300 was then sampled at 1.0)."""
    with caplog.at_level("WARNING", logger="minivllm.sampling_params"):
        assert SamplingParams(temperature=1e-40).temperature == 0.01
    assert "temperature 1e-40 is below 0.01" in caplog.text
    assert SamplingParams(temperature=0.0).temperature == 0.0  # greedy stays greedy
    assert SamplingParams(temperature=0.01).temperature == 0.01


def test_extreme_temperatures_and_penalties_run(llm: LLM) -> None:
    """Any finite value SamplingParams takes reaches the sampler as a float32 that computes:
    no overflow in the cast (numpy's warning is an error here), no NaN logits. A near-zero
    temperature samples like greedy on this model; a huge one like any temperature (valid
    tokens, finite logprobs)."""
    prompt = {"prompt_token_ids": [1, 2, 3]}
    greedy = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for temperature in (1e-40, 1e-300):
            params = SamplingParams(temperature=temperature, max_tokens=4, ignore_eos=True, seed=0)
            out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
            assert out.token_ids == greedy, temperature
        vocab = llm.engine.info.vocab_size
        for kwargs in (
            {"temperature": 1e300},
            {"temperature": 0.7, "repetition_penalty": 1e300},
            {"temperature": 0.0, "repetition_penalty": 1e300},
            {"temperature": 0.0, "repetition_penalty": 1e-300},
            {"temperature": 0.7, "top_k": 3, "repetition_penalty": 1e-300},
            {"temperature": 0.7, "logit_bias": {7: -1e300}},
        ):
            params = SamplingParams(max_tokens=4, ignore_eos=True, seed=0, logprobs=1, **kwargs)
            out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
            assert len(out.token_ids) == 4 and all(0 <= t < vocab for t in out.token_ids)
            chosen = [entry[t].logprob for entry, t in zip(out.logprobs, out.token_ids)]
            assert all(math.isfinite(lp) or lp == float("-inf") for lp in chosen), kwargs
        # A bias of 1e300 forces its token, as +100 does (it was an inf logit: NaN
        # probabilities and token 0 every step).
        params = SamplingParams(temperature=0.7, max_tokens=4, ignore_eos=True, seed=0,
                                logit_bias={42: 1e300})  # fmt: skip
        assert params.logit_bias == {42: 100.0}
        assert llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids == [42] * 4
    still_serves(llm)


def test_never_fits_in_kv_cache(llm: LLM) -> None:
    # 12 blocks of 4 = 48 tokens; 40 + 20 can never fit, even alone.
    with pytest.raises(ValueError, match="KV"):
        llm.generate({"prompt_token_ids": [1] * 40}, SamplingParams(max_tokens=20), use_tqdm=False)
    still_serves(llm)


def test_max_model_len_stops_with_length(tiny_qwen3_dir: str) -> None:
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4, max_model_len=48)
    params = SamplingParams(max_tokens=None, ignore_eos=True, temperature=0.0)
    out = llm.generate({"prompt_token_ids": [1] * 40}, params, use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "length"
    assert len(out[0].outputs[0].token_ids) == 8


def test_unknown_option(tiny_qwen3_dir: str) -> None:
    with pytest.raises(TypeError, match="max_num_sequences"):
        LLM(tiny_qwen3_dir, max_num_sequences=4)


def test_missing_model_dir(tmp_path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError, match="nope"):
        LLM(missing)


def test_unsupported_architecture(tiny_qwen3_dir: str, tmp_path) -> None:
    target = tmp_path / "weird"
    shutil.copytree(tiny_qwen3_dir, target)
    cfg = json.loads((target / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (target / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"MambaForCausalLM.*Qwen3ForCausalLM"):
        LLM(str(target), device="cpu")


def test_missing_weights(tiny_qwen3_dir: str, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    target = tmp_path / "missing"
    shutil.copytree(tiny_qwen3_dir, target)
    tensors = load_file(str(target / "model.safetensors"))
    del tensors["model.layers.0.mlp.down_proj.weight"]
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.layers.0.mlp.down_proj.weight"):
        LLM(str(target), device="cpu")


def test_truncated_checkpoint(tiny_qwen3_dir: str, tmp_path) -> None:
    target = tmp_path / "truncated"
    shutil.copytree(tiny_qwen3_dir, target)
    path = target / "model.safetensors"
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ValueError, match="model.safetensors"):
        LLM(str(target), device="cpu")


def model_dir_cases(tiny_qwen3_dir: str, root) -> dict[str, tuple[str, dict, str]]:
    """name -> (model dir, LLM options, words the error must contain)."""

    def variant(name: str, edit) -> str:
        target = root / name
        shutil.copytree(tiny_qwen3_dir, target)
        edit(target)
        return str(target)

    def set_config(target, config) -> None:
        (target / "config.json").write_text(json.dumps(config))

    config = json.loads(open(os.path.join(tiny_qwen3_dir, "config.json")).read())
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "vocab_size": 500}
    no_hidden = {k: v for k, v in config.items() if k != "hidden_size"}
    empty = root / "empty"
    empty.mkdir()

    def drop_tokenizer(target) -> None:
        for name in os.listdir(target):
            if name.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
                os.remove(target / name)

    return {
        "gpt2": (variant("gpt2", lambda t: set_config(t, gpt2)), {}, r"GPT2LMHeadModel.*Qwen3"),
        "no_hidden_size": (variant("nohs", lambda t: set_config(t, no_hidden)), {}, "hidden_size"),
        "json_list": (variant("list", lambda t: set_config(t, [config])), {}, "JSON object"),
        "empty_dir": (str(empty), {}, "no config.json"),
        "no_tokenizer": (variant("notok", drop_tokenizer), {}, "no tokenizer files"),
        "missing_tokenizer": (tiny_qwen3_dir, {"tokenizer": "/nonexistent"}, "/nonexistent"),
    }


CASES = ["gpt2", "no_hidden_size", "json_list", "empty_dir", "no_tokenizer", "missing_tokenizer"]


@pytest.mark.parametrize("case", CASES)
def test_bad_model_directory(case: str, tiny_qwen3_dir: str, tmp_path, capsys) -> None:
    """Each gives one clear ValueError (they were KeyError, TypeError, a sentencepiece or HF
    repo-id error, or a silently built empty tokenizer), and the CLI prints it on one line."""
    from minivllm.entrypoints.cli import main

    model, options, words = model_dir_cases(tiny_qwen3_dir, tmp_path)[case]
    with pytest.raises(ValueError, match=words):
        LLM(model, device="cpu", **options)
    argv = ["generate", "--model", model, "--no-progress", "--device", "cpu"]
    if "tokenizer" in options:
        argv += ["--tokenizer", options["tokenizer"]]
    assert main(argv) == 2
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err_lines) == 1 and err_lines[0].startswith("minivllm: error:")
    assert re.search(words, err_lines[0])


def test_logprobs_above_max_logprobs(llm: LLM, tiny_qwen3_dir: str) -> None:
    """vLLM's cap (max_logprobs, default 20); logprobs=10**9 used to return the vocabulary."""
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"{name}=21.*max_logprobs=20"):
            llm.generate([1, 2, 3], SamplingParams(**{name: 21}), use_tqdm=False)
        llm.generate([1, 2, 3], SamplingParams(max_tokens=2, **{name: 20}), use_tqdm=False)
    still_serves(llm)
    whole = LLM(tiny_qwen3_dir, device="cpu", max_logprobs=-1, num_gpu_blocks_override=8)
    vocab = whole.engine.info.vocab_size
    out = whole.generate([1, 2], SamplingParams(max_tokens=1, logprobs=vocab), use_tqdm=False)
    assert len(out[0].outputs[0].logprobs[0]) == vocab
    with pytest.raises(ValueError, match="max_logprobs"):
        whole.generate([1, 2], SamplingParams(logprobs=vocab + 1), use_tqdm=False)
    with pytest.raises(ValueError, match="max_logprobs"):
        LLM(tiny_qwen3_dir, device="cpu", max_logprobs=-2)
