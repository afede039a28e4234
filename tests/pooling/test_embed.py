"""LLM.embed against sentence-transformers' pooling over HF transformers: last, mean and cls,
alone and batched, chunked, with Matryoshka dimensions."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from minivllm import LLM
from tests.kernels.ordered_dot import ordered_dot  # noqa: F401 (fixture)

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "hi",
    "A paged attention cache stores keys and values in blocks, and the scheduler decides.",
]
CPU = dict(dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=256)


def reference(model_dir: str, texts: list[str], mode: str, normalize: bool) -> torch.Tensor:
    """sentence-transformers' Transformer + Pooling (+ Normalize) written out over HF: the
    final hidden states of each text alone, pooled."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    rows = []
    for text in texts:
        ids = torch.tensor([tokenizer.encode(text)])
        with torch.no_grad():
            hidden = model(input_ids=ids).last_hidden_state[0]
        row = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[mode]
        rows.append(torch.nn.functional.normalize(row, dim=0) if normalize else row)
    return torch.stack(rows)


@pytest.mark.parametrize(
    "fixture, mode, normalize",
    [("embed_last_dir", "last", True), ("embed_mean_dir", "mean", False),
     ("embed_cls_dir", "cls", True)],
)  # fmt: skip
def test_embeddings_equal_reference(fixture, mode, normalize, request) -> None:
    model_dir = request.getfixturevalue(fixture)
    want = reference(model_dir, TEXTS, mode, normalize)
    # A 16-token step budget splits the longer texts into chunks.
    llm = LLM(model_dir, task="embed", max_num_batched_tokens=16, **CPU)
    batched = llm.embed(TEXTS, use_tqdm=False)
    got = torch.tensor([o.outputs.embedding for o in batched])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for text, row in zip(TEXTS, want):
        alone = llm.embed(text, use_tqdm=False)[0].outputs.embedding
        torch.testing.assert_close(torch.tensor(alone), row, atol=1e-5, rtol=1e-5)


def test_sentence_transformers_encode(embed_last_dir: str) -> None:
    """The real sentence-transformers over the same directory."""
    st = pytest.importorskip("sentence_transformers")
    want = st.SentenceTransformer(embed_last_dir, device="cpu").encode(TEXTS, batch_size=1)
    llm = LLM(embed_last_dir, task="embed", **CPU)
    got = [o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=1e-5)


def test_dimensions_cut_then_normalise(embed_last_dir: str) -> None:
    llm = LLM(embed_last_dir, task="embed", **CPU)
    full = torch.tensor(llm.embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding)
    cut = torch.tensor(llm.embed(TEXTS[0], dimensions=16, use_tqdm=False)[0].outputs.embedding)
    assert cut.shape == (16,)
    torch.testing.assert_close(cut, torch.nn.functional.normalize(full[:16], dim=0))
    with pytest.raises(ValueError, match="dimensions"):
        llm.embed(TEXTS[0], dimensions=65, use_tqdm=False)


def test_token_ids_and_prefix_hits(embed_last_dir: str) -> None:
    """Token-id prompts; a prompt sharing a cached prefix pools the same vector (last)."""
    llm = LLM(embed_last_dir, task="embed", **CPU)
    ids = llm.get_tokenizer().encode(TEXTS[3])
    first = llm.embed([ids], use_tqdm=False)[0]
    again = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0]
    assert first.prompt_token_ids == ids
    torch.testing.assert_close(
        torch.tensor(again.outputs.embedding), torch.tensor(first.outputs.embedding)
    )


def test_embed_needs_the_task(embed_last_dir: str) -> None:
    with pytest.raises(ValueError, match="task"):
        LLM(embed_last_dir, task="classify", **CPU)
    llm = LLM(embed_last_dir, **CPU)
    with pytest.raises(ValueError, match="task='embed'"):
        llm.embed("x", use_tqdm=False)


@pytest.mark.usefixtures("ordered_dot")
@pytest.mark.parametrize("fixture", ["embed_last_dir", "embed_mean_dir"])
def test_deterministic_same_bits_alone_and_batched(fixture, request) -> None:
    """Deterministic mode (batch-invariant kernels, in the interpreter on the CPU): a text's
    vector is the same bits alone, in a batch, and chunked among others."""
    model_dir = request.getfixturevalue(fixture)
    options = dict(CPU, attention_backend="triton", deterministic=True, block_size=8)
    llm = LLM(model_dir, task="embed", max_num_batched_tokens=16, **options)
    batched = [o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)]
    for text, want in zip(TEXTS, batched):
        assert llm.embed(text, use_tqdm=False)[0].outputs.embedding == want


@pytest.mark.parametrize("tied", [True, False])
def test_bare_decoder_checkpoint(tied: bool, tmp_path) -> None:
    """Qwen3-Embedding's checkpoint is the bare decoder (no "model." prefix, no LM head), as
    sentence-transformers saves it: it loads, and embeds as transformers does."""
    from transformers import Qwen3Model

    from minivllm.tiny_model import (
        build_tiny_tokenizer,
        tiny_hf_config,
        write_sentence_transformers_files,
    )

    tokenizer = build_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = tiny_hf_config("Qwen3ForCausalLM", len(tokenizer), eos, tie_word_embeddings=tied)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        Qwen3Model(config).save_pretrained(tmp_path)
    # Qwen3-Embedding's config.json names the causal LM (transformers writes Qwen3Model).
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    write_sentence_transformers_files(str(tmp_path), "last", True)
    want = reference(str(tmp_path), TEXTS[:2], "last", True)
    got = LLM(str(tmp_path), task="embed", **CPU).embed(TEXTS[:2], use_tqdm=False)
    torch.testing.assert_close(torch.tensor([o.outputs.embedding for o in got]), want)


def test_prefill_only_frees_its_blocks(embed_mean_dir: str) -> None:
    """Few blocks and 8-token chunks: mean-pooled prompts over several steps pool every
    position once; after them every block is free and the runner holds no state."""
    want = reference(embed_mean_dir, TEXTS, "mean", False)
    options = dict(CPU, num_gpu_blocks_override=8, max_num_batched_tokens=8)
    llm = LLM(embed_mean_dir, task="embed", **options)
    got = [o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)]
    torch.testing.assert_close(torch.tensor(got), want, atol=1e-5, rtol=1e-5)
    llm.engine.step()  # the finished requests' ids reach the runner with the next step
    assert llm.engine.scheduler.block_manager.num_free_blocks == 8
    assert not llm.engine.executor.runner.pooling.params
