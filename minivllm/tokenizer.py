"""Loads a model's HF tokenizer: from a directory's tokenizer files, or from a GGUF file's
metadata (vocab, merges, special tokens, chat template).

Building a tokenizer from GGUF metadata takes seconds (transformers parses the file and
converts the vocabulary); the result is kept as tokenizer files in a cache directory keyed by
the file's path, size and mtime and the transformers version, and loaded from there next time.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from typing import Any

from minivllm.cache_dir import cache_root, publish_dir
from minivllm.gguf_hybrid import VOCABULARY_ONLY_TOKENIZERS
from minivllm.gguf_loader import find_gguf_file, gguf_architecture, import_gguf

logger = logging.getLogger(__name__)

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
    from transformers import (  # seconds to import; only frontends need it
        AutoTokenizer,
        PreTrainedTokenizerFast,
    )

    gguf_file = find_gguf_file(model)
    if gguf_file is None:
        check_tokenizer_files(model)
        return AutoTokenizer.from_pretrained(model)
    import_gguf(gguf_file)  # transformers' own message would not say which package
    cached = gguf_tokenizer_cache_dir(gguf_file)
    if os.path.isdir(cached):
        return AutoTokenizer.from_pretrained(cached)
    directory, name = os.path.split(os.path.abspath(gguf_file))
    # Silent, this is the longest wait of a first run: say what it is and that it is once.
    print(
        f"[minivllm] building the tokenizer from {name}'s vocabulary: once per file, about "
        f"10-40 s on a small CPU; kept under {cached}",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    if gguf_architecture(gguf_file) in VOCABULARY_ONLY_TOKENIZERS:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(directory, gguf_file=name)
    else:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    _save_to_cache(tokenizer, cached)
    print(
        f"[minivllm] tokenizer built in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return tokenizer


def gguf_tokenizer_cache_dir(gguf_file: str) -> str:
    """Where the tokenizer built from gguf_file is kept: one directory per (absolute path, size,
    mtime, transformers version), so a rewritten file or another transformers builds anew."""
    import transformers

    path = os.path.abspath(gguf_file)
    stat = os.stat(path)
    key = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return os.path.join(cache_root(), "gguf-tokenizers", digest)


def _save_to_cache(tokenizer: Any, cached: str) -> None:
    """Publishes the tokenizer's files at `cached` (cache_dir.publish_dir: a reader never sees
    half of them; a concurrent writer that got there first wins). A cache that cannot be
    written is skipped."""
    try:
        publish_dir(cached, tokenizer.save_pretrained)
    except OSError as err:
        logger.debug("tokenizer cache not written to %s: %s", cached, err)
