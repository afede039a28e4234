"""IncrementalDetokenizer and decode_logprobs over a real (tiny, byte-level BPE) tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from minivllm.entrypoints.processing import IncrementalDetokenizer, TokenTexts, decode_logprobs
from minivllm.outputs import Logprob

EOS = "<|endoftext|>"
IM_END = "<|im_end|>"
CORPUS = [
    "the cat sat on the mat. the dog sat on the log.",
    "hello world, hello there, café",
] * 20
MULTI_BYTE_TEXTS = ["naïve café résumé", "日本語のテキスト", "emoji 😀🎉 ok", "mixed é日本😀 end"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, additional_special_tokens=[IM_END]
    )


def stream(detok: IncrementalDetokenizer, token_ids: list[int]) -> list[str]:
    """Feeds tokens one at a time, the last one with finished=True; returns the deltas."""
    return [
        detok.add_tokens([t], finished=i == len(token_ids) - 1) for i, t in enumerate(token_ids)
    ]


@pytest.mark.parametrize("text", MULTI_BYTE_TEXTS)
def test_multi_byte_characters_stream_whole(tokenizer, text):
    token_ids = tokenizer.encode(text)
    # The test only means something if some character is split across tokens.
    assert any("\ufffd" in tokenizer.decode([t]) for t in token_ids)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("the cat"))
    deltas = stream(detok, token_ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == text


def test_first_token_keeps_its_leading_space(tokenizer):
    prompt = tokenizer.encode("hello")
    detok = IncrementalDetokenizer(tokenizer, prompt)
    assert detok.add_tokens(tokenizer.encode(" world"), finished=True) == " world"


def test_several_tokens_per_call(tokenizer):
    token_ids = tokenizer.encode("emoji 😀🎉 the cat")
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = [detok.add_tokens(token_ids[i : i + 3]) for i in range(0, len(token_ids), 3)]
    deltas.append(detok.add_tokens([], finished=True))
    assert "".join(deltas) == "emoji 😀🎉 the cat"


def test_stop_string_spanning_tokens(tokenizer):
    token_ids = tokenizer.encode("the cat sat on the mat")
    assert [tokenizer.decode([t]) for t in token_ids][2:4] == [" sat", " on"]
    detok = IncrementalDetokenizer(tokenizer, [], stop=["sat on", "zebra"])
    deltas = [detok.add_tokens([t]) for t in token_ids]
    assert detok.stopped and detok.stop_reason == "sat on"
    assert detok.text == "the cat "
    # Deltas never showed any part of the stop string, and stop after it.
    assert "".join(deltas) == "the cat "
    assert detok.add_tokens(tokenizer.encode(" more"), finished=True) == ""


def test_include_stop_str_in_output(tokenizer):
    token_ids = tokenizer.encode("the cat sat on the mat")
    detok = IncrementalDetokenizer(tokenizer, [], stop=["sat on"], include_stop_str_in_output=True)
    deltas = [detok.add_tokens([t]) for t in token_ids]
    assert detok.text == "".join(deltas) == "the cat sat on"


def test_earliest_stop_string_wins(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [], stop=["mat", "at"])
    detok.add_tokens(tokenizer.encode("the cat sat on the mat"))
    assert detok.stop_reason == "at" and detok.text == "the c"


def test_stop_string_inside_one_token_and_multi_byte_stop(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [], stop=["og"])
    stream(detok, tokenizer.encode("the dog sat"))
    assert detok.text == "the d" and detok.stop_reason == "og"
    detok = IncrementalDetokenizer(tokenizer, [], stop=["😀"])
    deltas = stream(detok, tokenizer.encode("emoji 😀🎉 ok"))
    assert detok.text == "".join(deltas) == "emoji "


def test_held_back_text_is_released(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [], stop=["cat!"])
    token_ids = tokenizer.encode("the cat sat")
    shown = "".join(detok.add_tokens([t]) for t in token_ids)
    # Up to len("cat!") - 1 characters wait: they might start the stop string.
    assert shown == "the cat "
    assert shown + detok.add_tokens([], finished=True) == "the cat sat" == detok.text
    assert not detok.stopped


def test_stop_token_text_is_left_out(tokenizer):
    eos_id = tokenizer.eos_token_id
    cases = [
        (True, False, "the cat"),
        (False, False, "the cat"),
        (False, True, "the cat" + EOS),
    ]
    for skip_special_tokens, include_stop, expected in cases:
        detok = IncrementalDetokenizer(
            tokenizer,
            [],
            skip_special_tokens=skip_special_tokens,
            include_stop_str_in_output=include_stop,
        )
        delta = detok.add_tokens(tokenizer.encode("the cat"))
        delta += detok.add_tokens([eos_id], stopped_by_token=True)
        assert delta == detok.text == expected


def test_skip_special_tokens(tokenizer):
    token_ids = tokenizer.encode("the cat" + IM_END + " sat")
    assert tokenizer.convert_tokens_to_ids(IM_END) in token_ids
    for skip, expected in ((True, "the cat sat"), (False, "the cat" + IM_END + " sat")):
        detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        assert "".join(stream(detok, token_ids)) == detok.text == expected


def test_decode_logprobs(tokenizer):
    token_ids = tokenizer.encode(" cat hello")
    entries = {t: Logprob(-1.0 * i, i + 1) for i, t in enumerate(token_ids)}
    result = decode_logprobs(TokenTexts(tokenizer), entries)
    assert result is entries
    assert [e.decoded_token for e in entries.values()] == [" cat", " hello"]


def test_token_texts_decode_each_id_once(tokenizer):
    calls = []

    class Counting:
        def decode(self, ids, **kwargs):
            calls.append(tuple(ids))
            return tokenizer.decode(ids, **kwargs)

    texts = TokenTexts(Counting())
    token_ids = tokenizer.encode(" cat hello cat")
    assert [texts(t) for t in token_ids * 3] == [tokenizer.decode([t]) for t in token_ids * 3]
    assert sorted(calls) == sorted({(t,) for t in token_ids})


@pytest.mark.parametrize("text", MULTI_BYTE_TEXTS)
def test_output_ending_mid_character_keeps_its_text(tokenizer, text):
    """At finish the text is what the tokenizer decodes from the output ids, even when they
    end in the middle of a character (the old code dropped the whole text then)."""
    token_ids = tokenizer.encode(text)
    cuts = [i for i in range(1, len(token_ids)) if tokenizer.decode(token_ids[:i])[-1] == "\ufffd"]
    assert cuts  # the case exists for this text
    for cut in cuts:
        output_ids = token_ids[:cut]
        expected = tokenizer.decode(output_ids)
        whole = IncrementalDetokenizer(tokenizer, tokenizer.encode("the cat"))
        assert whole.add_tokens(output_ids, finished=True) == expected == whole.text
        streamed = IncrementalDetokenizer(tokenizer, tokenizer.encode("the cat"))
        deltas = stream(streamed, output_ids)
        # Before the end an incomplete character is withheld, at the end it is flushed.
        assert all("\ufffd" not in d for d in deltas[:-1])
        assert "".join(deltas) == streamed.text == expected


def test_token_texts_learn_decodes_new_ids_in_one_batch_as_decode_would(tokenizer):
    token_ids = list(range(len(tokenizer)))
    texts = TokenTexts(tokenizer)
    texts.learn(token_ids[:5])  # a few ids first: learn decodes only the rest below
    batches = []
    batch_decode = texts._decode_batch
    texts._decode_batch = lambda ids, skip: batches.append(len(ids)) or batch_decode(ids, skip)
    texts.learn(token_ids + token_ids)
    assert batches == [len(token_ids) - 5]
    expected = [tokenizer.decode([t], clean_up_tokenization_spaces=False) for t in token_ids]
    texts.tokenizer = None  # every text now comes from what learn decoded
    assert [texts(t) for t in token_ids] == expected
