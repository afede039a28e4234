"""Loads a model's HF tokenizer: from a directory's tokenizer files, or from a GGUF file's
metadata (vocab, merges, special tokens, chat template)."""

from __future__ import annotations

import os
from typing import Any

from minivllm.gguf_loader import find_gguf_file, import_gguf

# Any one of these makes a directory loadable by AutoTokenizer (fast, SentencePiece, BPE...).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


def check_tokenizer_files(path: str) -> None:
    """ValueError unless the directory path holds tokenizer files: without them transformers
    may build an empty tokenizer that turns every text into nothing."""
    if not os.path.isdir(path):
        raise ValueError(f"tokenizer directory does not exist: {path!r}")
    if not any(os.path.isfile(os.path.join(path, name)) for name in _TOKENIZER_FILES):
        raise ValueError(
            f"no tokenizer files in {path!r} (looked for {', '.join(_TOKENIZER_FILES)}); "
            "pass tokenizer=DIR (--tokenizer) for a directory that has them"
        )


def load_tokenizer(model: str) -> Any:
    """The HF tokenizer of a model path (a directory, a .gguf file, or a directory holding
    one); a directory without tokenizer files is a ValueError."""
    from transformers import AutoTokenizer  # seconds to import; only frontends need it

    gguf_file = find_gguf_file(model)
    if gguf_file is None:
        check_tokenizer_files(model)
        return AutoTokenizer.from_pretrained(model)
    import_gguf(gguf_file)  # transformers' own message would not say which package
    directory, name = os.path.split(os.path.abspath(gguf_file))
    return AutoTokenizer.from_pretrained(directory, gguf_file=name)
