"""`minivllm chat`: a terminal chat through the model's chat template, the reply streamed as it
is generated. The history is kept; `/clear` forgets it; `/exit` or Ctrl-D leaves."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any

from minivllm.demo_model import default_model
from minivllm.engine.types import EngineRequest
from minivllm.entrypoints.engine_args import engine_options
from minivllm.entrypoints.llm import LLM
from minivllm.entrypoints.output_processor import OutputProcessor
from minivllm.sampling_params import SamplingParams

EXIT_COMMANDS = ("/exit", "/quit")


def run_chat(args: argparse.Namespace) -> int:
    model = args.model
    if model is None:
        model, notice = default_model()
        print(notice, file=sys.stderr)
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed_sampling
    )
    llm = LLM(model, **engine_options(args))
    try:
        interactive = sys.stdin.isatty()
        if interactive:
            print("[minivllm] /exit or Ctrl-D to leave, /clear to forget the chat", file=sys.stderr)
        chat_loop(llm, params, sys.stdin, sys.stdout, interactive, args.system)
    finally:
        llm.shutdown()
    return 0


def chat_loop(
    llm: Any,
    params: SamplingParams,
    stdin: IO[str],
    stdout: IO[str],
    interactive: bool,
    system: str | None = None,
) -> None:
    """Reads user lines until /exit or end of input; answers each with the whole history."""
    opening = [{"role": "system", "content": system}] if system else []
    messages = list(opening)
    while True:
        line = _read_line(stdin, interactive)
        if line is None or line.strip() in EXIT_COMMANDS:
            return
        if not line.strip():
            continue
        if line.strip() == "/clear":
            messages = list(opening)
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        try:
            reply = _answer(llm, messages, params, stdout)
        except ValueError as e:  # e.g. the history outgrew max_model_len
            messages.pop()
            print(f"minivllm: error: {e} (/clear forgets the history)", file=sys.stderr)
            continue
        messages.append({"role": "assistant", "content": reply})


def _read_line(stdin: IO[str], interactive: bool) -> str | None:
    """One line of user input; None at end of input (Ctrl-D) or Ctrl-C at the prompt."""
    try:
        if interactive and stdin is sys.stdin:
            return input(">>> ")  # line editing via readline
        line = stdin.readline()
        return line or None
    except (EOFError, KeyboardInterrupt):
        return None


def _answer(llm: Any, messages: list[dict], params: SamplingParams, out: IO[str]) -> str:
    """Streams one reply to `out`; Ctrl-C cuts it short (what was said is kept)."""
    token_ids = llm.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    if isinstance(token_ids, dict) or hasattr(token_ids, "input_ids"):
        token_ids = token_ids["input_ids"]
    parts: list[str] = []
    try:
        for delta in stream_text(llm, list(token_ids), params):
            parts.append(delta)
            out.write(delta)
            out.flush()
    except KeyboardInterrupt:
        out.write(" [interrupted]")
    out.write("\n")
    out.flush()
    return "".join(parts)


def stream_text(llm: Any, prompt_token_ids: list[int], params: SamplingParams) -> Iterator[str]:
    """Yields the text of one completion as it grows (each new piece once), stepping the LLM's
    engine directly; the request is aborted if the caller stops early."""
    processor = OutputProcessor(llm.tokenizer, stream=True)
    params = params.derive(n=1, eos_token_ids=list(llm.generation_defaults.eos_token_ids))
    llm.validate_request(prompt_token_ids, params)
    # Unique: the core keeps a finished request's id until its next step.
    request_id = f"chat-{uuid.uuid4().hex}"
    arrival = time.time()
    num_sent = 0
    try:
        children = processor.add_request(request_id, None, prompt_token_ids, params, arrival)
        llm.engine.add_requests(
            [EngineRequest(child_id, prompt_token_ids, p, arrival) for child_id, p in children]
        )
        while llm.engine.has_unfinished_requests():
            outputs, to_abort = processor.process(llm.engine.step())
            if to_abort:
                llm.engine.abort_requests(to_abort)
            for output in outputs:
                text = output.outputs[0].text
                if len(text) > num_sent:
                    yield text[num_sent:]
                    num_sent = len(text)
    finally:
        core_ids = processor.abort_all()  # empty unless the caller stopped early
        if core_ids:
            llm.engine.abort_requests(core_ids)
