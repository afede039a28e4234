"""AsyncLLM: the server's engine. Tokenizer and output processing here, EngineCore in its own
process (engine/client/core_client.py; N replica processes under data parallelism,
engine/client/dp_core_client.py), outputs routed to one mailbox per request. Each request is
validated here, once, so that a bad one is a 400 before anything is sent to the core."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from minivllm.config import EngineConfig
from minivllm.engine.client.core_client import EngineCoreClient, EngineCoreError
from minivllm.engine.client.dp_core_client import DPCoreClient
from minivllm.engine.client.protocol import EngineClient, MessageKind
from minivllm.engine.request_checks import check_cache_salt, check_priority, check_request
from minivllm.engine.stats import CoreInfo, EngineStats
from minivllm.engine.types import EngineOutput, EngineRequest
from minivllm.entrypoints.async_tokenizer import AsyncTokenizer
from minivllm.entrypoints.generation_config import GenerationDefaults, read_generation_defaults
from minivllm.entrypoints.output_processor import OutputProcessor
from minivllm.models.model_config import ModelConfig
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.check import CHECK_TIMEOUT_S, CompiledSpecs, check_timed_out
from minivllm.structured_output.params import StructuredOutputsParams
from minivllm.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)
# vLLM's VLLM_ENGINE_ITERATION_TIMEOUT_S, under our prefix: seconds the core may go without a
# message while requests are open before /health calls it stalled.
ITERATION_TIMEOUT_ENV = "MINIVLLM_ENGINE_ITERATION_TIMEOUT_S"
DEFAULT_ITERATION_TIMEOUT_S = 60.0


def iteration_timeout_s() -> float:
    """The stall threshold: MINIVLLM_ENGINE_ITERATION_TIMEOUT_S, else 60 s (vLLM's default)."""
    value = os.environ.get(ITERATION_TIMEOUT_ENV, "")
    try:
        timeout = float(value) if value else DEFAULT_ITERATION_TIMEOUT_S
    except ValueError:
        raise ValueError(
            f"{ITERATION_TIMEOUT_ENV} must be a number of seconds, got {value!r}"
        ) from None
    if not timeout > 0:
        raise ValueError(f"{ITERATION_TIMEOUT_ENV} must be > 0, got {value!r}")
    return timeout


class EngineObserver(Protocol):
    """Sees every step (for metrics): its engine outputs, the request outputs built from
    them, the core's stats; and every abort."""

    def on_step(
        self, engine_outputs: list[EngineOutput], outputs: list[RequestOutput], stats: EngineStats
    ) -> None: ...

    def on_abort(self, request_id: str) -> None: ...


class EngineDeadError(RuntimeError):
    """The engine core died or its step raised; no request can be served any more."""


@dataclass
class _Mailbox:
    """The latest output of one request. Outputs are cumulative, so a consumer that falls
    behind simply reads the newest one: no queue grows while a client is slow."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    latest: RequestOutput | None = None
    error: Exception | None = None
    # With stream_interval > 1: tokens (of its longest sample) in the output the consumer last
    # read; it is woken again once stream_interval more have come.
    num_read_tokens: int = 0


class AsyncLLM:
    """vLLM's AsyncLLM: `async for out in engine.generate(...)`, `engine.abort(request_id)`.

    Every method runs on one asyncio loop (attach_loop); the core client's reader thread only
    hands messages over to that loop, one per engine step.
    """

    def __init__(
        self,
        config: EngineConfig,
        generation_config: str = "auto",
        observer: EngineObserver | None = None,
    ) -> None:
        self.config = config
        # A bad model directory fails here, in one line; the core is handed what is read.
        model_config = ModelConfig.from_hf(config.model)
        self.tokenizer = load_tokenizer(config.resolved_tokenizer())  # HF dir or GGUF
        self.async_tokenizer = AsyncTokenizer(self.tokenizer)  # prompts, off the event loop
        self.generation_defaults = _generation_defaults(config.model, generation_config, self)
        self.output_processor = OutputProcessor(self.tokenizer, stream=True)
        self.observer = observer
        self.stats = EngineStats()
        self.dead_reason: str | None = None
        # The core died (not asked to stop); on_dead is called on the loop when it does.
        self.core_failed = False
        self.on_dead: Callable[[], None] | None = None
        self.iteration_timeout_s = iteration_timeout_s()
        # When the core last showed progress: a message from it, or work arriving at an idle
        # engine (the clock of a stall starts then, not at the last message before idling).
        self._last_progress = time.monotonic()
        self._mailboxes: dict[str, _Mailbox] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._compiled_specs = CompiledSpecs()  # checked by the core: no round trip again
        # One core process, or data_parallel_size replicas behind the same interface.
        client_class = EngineCoreClient if config.data_parallel_size == 1 else DPCoreClient
        self._client: EngineClient = client_class(config, model_config, self._on_message_threadsafe)
        self.info: CoreInfo = self._client.info
        self.max_model_len = self.info.max_model_len

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Binds the engine to the loop that will call it (the server's)."""
        self._loop = loop
        if self.core_failed and self.on_dead is not None:  # died before the loop was there
            loop.call_soon(self.on_dead)

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    @property
    def num_open_requests(self) -> int:
        return len(self._mailboxes)

    def stalled_for(self) -> float:
        """Seconds the core has gone without a message while requests are open (0 when
        idle). Past iteration_timeout_s the core is stalled (stopped, wedged): /health 503."""
        if not self._mailboxes:
            return 0.0
        return time.monotonic() - self._last_progress

    @property
    def is_stalled(self) -> bool:
        return self.stalled_for() > self.iteration_timeout_s

    def default_sampling(self) -> dict[str, Any]:
        """Sampling defaults from generation_config.json (vLLM applies them the same way)."""
        return dict(self.generation_defaults.sampling)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A prompt's token ids, as tokenizer.encode gives them, without blocking the loop."""
        return await self.async_tokenizer.encode(text, add_special_tokens)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """The engine's checks (engine/request_checks.py), made here and only here: the core
        takes what passes as it is, and a bad request is a 400 before anything is sent."""
        check_request(prompt_token_ids, params, self.info, self.config.max_logprobs)

    async def check_grammar(
        self, constraint: StructuredOutputsParams, refuse_when_busy: bool = False
    ) -> None:
        """Compiles a constraint in the engine core (its request's compile there is then a
        cache hit), without blocking the loop: ValueError for a spec that cannot be honoured
        (or not within the time limit), CompilerBusy while no compile worker is free (with
        refuse_when_busy), EngineDeadError where the core is gone, RuntimeError where the
        grammar engine cannot run. A spec the core has compiled before passes at once."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        spec = constraint.spec_key()
        if spec in self._compiled_specs:
            return
        check = self._client.check_grammar(spec, refuse_when_busy)
        try:
            outcome = await asyncio.wait_for(asyncio.wrap_future(check), CHECK_TIMEOUT_S)
        except asyncio.TimeoutError:  # the builtin TimeoutError from Python 3.11 on
            raise check_timed_out(constraint.kind) from None
        except EngineCoreError as e:
            raise EngineDeadError(str(e)) from None
        outcome.raise_error()
        self._compiled_specs.add(spec)

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Validates and submits a request now (ValueError if it is bad, EngineDeadError if
        the engine is gone); returns the iterator of its outputs. Not iterating it to the
        end leaks nothing only if you call abort(request_id). cache_salt: prefix-cache
        blocks are shared only with requests of the same salt; priority: under the
        "priority" scheduling policy, a lower value is served first."""
        requests = [(request_id, prompt, prompt_token_ids, params)]
        return self.add_requests(requests, cache_salt, priority)[0]

    def add_requests(
        self,
        requests: list[tuple[str, str | None, list[int], SamplingParams]],
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> list[AsyncIterator[RequestOutput]]:
        """add_request for several (request_id, prompt, prompt_token_ids, params) at once:
        all are validated before any is submitted, so a bad one submits nothing; if a
        submission fails, those already made are aborted."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        self.validate_options(cache_salt, priority)
        for _, _, prompt_token_ids, params in requests:
            self.validate(prompt_token_ids, params)
        return self.add_validated_requests(requests, cache_salt, priority)

    def validate_options(self, cache_salt: str | None, priority: int) -> None:
        """The checks of a request's cache salt and priority (ValueError)."""
        check_cache_salt(cache_salt)
        check_priority(priority, self.config.scheduling_policy)

    def add_validated_requests(
        self,
        requests: list[tuple[str, str | None, list[int], SamplingParams]],
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> list[AsyncIterator[RequestOutput]]:
        """add_requests for requests that validate() has passed (a caller that validates a
        large batch first, then submits it in slices): nothing is checked again."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        eos = self.generation_defaults.eos_token_ids
        if not self._mailboxes:
            self._last_progress = time.monotonic()
        iterators: list[AsyncIterator[RequestOutput]] = []
        try:
            for request_id, prompt, prompt_token_ids, params in requests:
                params = params.derive(eos_token_ids=list(eos))
                arrival = time.time()
                children = self.output_processor.add_request(
                    request_id, prompt, prompt_token_ids, params, arrival
                )
                mailbox = _Mailbox()
                self._mailboxes[request_id] = mailbox
                self._client.add_requests(
                    [
                        EngineRequest(cid, prompt_token_ids, p, arrival, cache_salt, priority)
                        for cid, p in children
                    ]
                )
                iterators.append(self._outputs(request_id, mailbox))
        except BaseException:  # abort those added, and the one half added (abort forgives)
            for request_id, *_ in requests[: len(iterators) + 1]:
                self.abort(request_id)
            raise
        return iterators

    async def generate(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> AsyncIterator[RequestOutput]:
        """Yields cumulative RequestOutputs until the last one (finished=True)."""
        async for output in self.add_request(request_id, prompt, prompt_token_ids, params):
            yield output

    def abort(self, request_id: str) -> None:
        """Stops a request; its KV blocks are freed by the core's next drain."""
        self._mailboxes.pop(request_id, None)
        self._client.abort_requests(self.output_processor.abort(request_id))
        if self.observer is not None:
            self.observer.on_abort(request_id)

    def shutdown(self) -> None:
        """Fails what is still open and stops the core process."""
        self._fail_all("the server is shutting down")
        self._client.shutdown()
        self.async_tokenizer.shutdown()

    # ---- internals ------------------------------------------------------------------------

    async def _outputs(self, request_id: str, mailbox: _Mailbox) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while True:
                await mailbox.event.wait()
                mailbox.event.clear()
                if mailbox.error is not None:
                    raise mailbox.error
                output = mailbox.latest
                assert output is not None
                finished = output.finished
                if self.config.stream_interval > 1:
                    mailbox.num_read_tokens = _longest(output)
                yield output
                if finished:
                    return
        finally:
            # Cancelled (client gone), closed early or failed: the core must forget it.
            if not finished:
                self.abort(request_id)

    def _on_message_threadsafe(self, msg: tuple) -> None:
        loop = self._loop
        if loop is None:  # no loop yet (startup): only a death can arrive
            if msg[0] is MessageKind.DEAD:
                self.dead_reason = msg[1]
                self.core_failed = True
            return
        try:
            loop.call_soon_threadsafe(self._on_message, msg)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    def _on_message(self, msg: tuple) -> None:
        kind = msg[0]
        self._last_progress = time.monotonic()
        if kind is MessageKind.OUTPUTS:
            self._on_outputs(msg[1], msg[2])
        elif kind is MessageKind.REJECTED:
            self._on_rejected(msg[1], msg[2])
        elif kind is MessageKind.DEAD:
            logger.error("engine core is dead: %s", msg[1])
            self._fail_all(msg[1])
            if not self.core_failed:
                self.core_failed = True
                if self.on_dead is not None:
                    self.on_dead()

    def _on_outputs(self, engine_outputs: list[EngineOutput], stats: EngineStats) -> None:
        self.stats = stats
        outputs, to_abort = self.output_processor.process(engine_outputs)
        self._client.abort_requests(to_abort)
        interval = self.config.stream_interval
        for output in outputs:
            mailbox = self._mailboxes.get(output.request_id)
            if mailbox is None:
                continue
            mailbox.latest = output
            if output.finished:
                mailbox.event.set()
                del self._mailboxes[output.request_id]
            elif interval == 1:
                mailbox.event.set()
            # vLLM's stream_interval: the first tokens at once, then every interval tokens.
            elif not mailbox.num_read_tokens or (
                _longest(output) - mailbox.num_read_tokens >= interval
            ):
                mailbox.event.set()
        if self.observer is not None:
            self.observer.on_step(engine_outputs, outputs, stats)

    def _on_rejected(self, child_id: str, message: str) -> None:
        request_id = self.output_processor.child_to_parent.get(child_id)
        if request_id is None:
            return
        mailbox = self._mailboxes.get(request_id)
        self.abort(request_id)
        if mailbox is not None:
            mailbox.error = ValueError(message)
            mailbox.event.set()

    def _fail_all(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
        for request_id, mailbox in list(self._mailboxes.items()):
            self.output_processor.abort(request_id)
            mailbox.error = EngineDeadError(reason)
            mailbox.event.set()
        self._mailboxes.clear()


def _longest(output: RequestOutput) -> int:
    """Tokens generated so far by the request's longest sample."""
    return max(len(c.token_ids) for c in output.outputs)


def _generation_defaults(
    model: str, generation_config: str, engine: AsyncLLM
) -> GenerationDefaults:
    """vLLM's --generation-config: "auto" (the model's), "vllm" (no sampling defaults) or a
    directory holding a generation_config.json. EOS ids always include the model's."""
    model_defaults = read_generation_defaults(model, engine.tokenizer)
    if generation_config == "auto":
        return model_defaults
    if generation_config == "vllm":
        return GenerationDefaults(model_defaults.eos_token_ids, {})
    other = read_generation_defaults(generation_config, engine.tokenizer)
    eos = tuple(dict.fromkeys(model_defaults.eos_token_ids + other.eos_token_ids))
    return GenerationDefaults(eos, other.sampling)
