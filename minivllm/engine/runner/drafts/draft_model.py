"""DraftModelProposer: speculative drafts from a smaller model with the target's vocabulary, run
by our own ModelRunner (its own KV cache and CUDA graphs), greedily. The target's runner calls
it after a step's tokens are read (runner/drafts/drafter.py).

Each call catches the draft model's KV up with every request's history (the prompt the first
time, then the tokens the last step added), samples the first draft from the last position,
and decodes one more draft per step up to the request's cap: one mixed step, then up to k - 1
decode steps, each batched over the drafting requests and launched before the step it
continues is read (its input a placeholder, as under async scheduling), so the host's read of
one step overlaps the device's next. Its drafts are certain (q one-hot), so
exact verification keeps the output the target's own, whatever the draft model says.

The draft's KV is its own, in blocks of a BlockManager of its own (no prefix sharing): enough
for `max_requests` requests of max_model_len tokens, fewer where the memory the target left (on
CUDA, what gpu_memory_utilization leaves free: the draft is built after the target's KV cache)
holds fewer. A request that finds no room, or more than `max_requests` drafting at once,
simply gets no drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from minivllm.config import EngineConfig
from minivllm.engine.runner.model_runner import ModelRunner
from minivllm.engine.runner.step_handle import StepHandle
from minivllm.engine.sched.kv.block_manager import BlockManager
from minivllm.engine.setup import resolve_setup
from minivllm.engine.types import (
    PLACEHOLDER_TOKEN_ID,
    NewRequestData,
    ScheduledChunk,
    SchedulerOutput,
)
from minivllm.models.model_config import ModelConfig
from minivllm.sampling_params import SamplingParams
from minivllm.spec_decode.proposer import DraftTokens, ProposeInput

_GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)

# Requests the draft model's KV cache holds at max_model_len when disable_by_batch_size is
# None (more drafting at once get no drafts).
DRAFT_MODEL_MAX_REQUESTS = 16


@dataclass
class _DraftRequest:
    """The draft model's view of one request; its blocks come from the proposer's
    BlockManager (which reads req_id, block_ids and num_computed_tokens)."""

    req_id: str
    block_ids: list[int] = field(default_factory=list)
    num_sent_blocks: int = 0  # of block_ids, those the runner's block table has
    num_computed_tokens: int = 0  # tokens whose draft KV is valid
    drafts: list[int] = field(default_factory=list)  # the last drafts whose KV was written


class DraftModelProposer:
    """The Proposer protocol (spec_decode/proposer.py) over a draft model."""

    def __init__(
        self,
        target: EngineConfig,
        max_model_len: int,
        vocab_size: int,
        num_speculative_tokens: int,
        max_requests: int,
    ) -> None:
        """target: the engine's config (device, dtype, block size); the draft model is
        speculative_config.model, built with the same options at max_model_len."""
        path = target.speculative_config.model
        config = replace(
            target,
            model=path,
            tokenizer=None,
            speculative_config=None,
            tensor_parallel_size=1,
            data_parallel_size=1,
            max_model_len=max_model_len,
            num_gpu_blocks_override=None,
            enable_return_routed_experts=False,  # the target's routing is the one returned
        )
        model_config = ModelConfig.from_hf(path)
        if model_config.linear_attention is not None:
            raise ValueError(
                f"speculative_config.model: {model_config.architecture} has linear-attention "
                "layers; a draft model's recurrent states are not kept per draft (use a draft "
                "model with attention layers only, or method 'ngram')"
            )
        if model_config.vocab_size != vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({model_config.vocab_size} tokens) must be the "
                f"target's ({vocab_size})"
            )
        device = config.resolved_device()
        if device.type == "cuda":  # the draft lives in what the target left free
            free, total = torch.cuda.mem_get_info(device)
            config = replace(config, gpu_memory_utilization=max(free / total * 0.95, 0.01))
        setup = resolve_setup(config, model_config)
        self.num_speculative_tokens = num_speculative_tokens
        self.max_requests = max_requests
        self.block_size = config.block_size
        blocks_per_request = -(-max_model_len // self.block_size)
        num_blocks = max_requests * blocks_per_request
        self.runner = ModelRunner(setup, setup.device)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            num_blocks = min(num_blocks, self.runner.kv_spec.num_blocks_for(int(free * 0.8)))
            if num_blocks < blocks_per_request:
                raise ValueError(
                    "no room for the draft model's KV cache next to the target's: lower "
                    "gpu_memory_utilization"
                )
        self.runner.initialize_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, self.block_size, enable_prefix_caching=False)
        self._requests: dict[str, _DraftRequest] = {}
        self._finished: list[str] = []

    def propose(self, batch: ProposeInput) -> DraftTokens:
        out = DraftTokens.empty(batch.num_requests, self.num_speculative_tokens)
        rows = []  # (row, req_id, history, cap)
        caps = batch.caps(self.num_speculative_tokens)
        for i, req_id in enumerate(batch.req_ids):
            history = list(batch.token_ids[i])  # kept past this call: a copy
            if caps[i] > 0 and self._reserve(req_id, history, caps[i]):
                rows.append((i, req_id, history, caps[i]))
        if not rows:
            return out
        # Each decode step is launched before the step it continues is read: its input is a
        # placeholder the runner fills on the device from that step's sampled ids, so the
        # host reads step j - 1 while step j runs.
        in_flight = self._first_drafts(rows)
        tokens: list[list[int]] = [[] for _ in rows]
        going = list(range(len(rows)))
        for j in range(1, max(cap for *_, cap in rows) + 1):
            previous, going = going, [n for n in going if rows[n][3] > j]
            launched = None
            if going:
                launched = self._decode([(rows[n][1], len(rows[n][2]) + j - 1) for n in going])
            for n, token in zip(previous, in_flight.result().sampled_token_ids, strict=True):
                tokens[n].append(token)
            in_flight = launched
        for (i, req_id, history, cap), row_tokens in zip(rows, tokens, strict=True):
            out.token_ids[i, :cap] = row_tokens
            out.num_draft_tokens[i] = cap
            state = self._requests[req_id]
            state.num_computed_tokens = len(history)
            state.drafts = row_tokens[:-1]  # the last draft was sampled, never fed back
        return out

    def remove_requests(self, req_ids: Sequence[str]) -> None:
        for req_id in req_ids:
            state = self._requests.pop(req_id, None)
            if state is not None:
                self.block_manager.free(state)
                self._finished.append(req_id)

    def _reserve(self, req_id: str, history: list[int], cap: int) -> bool:
        """Brings req_id's state up to `history` (its drafts that history confirms keep their
        KV) and gives it blocks for history + cap - 1 tokens; False when there is no room."""
        state = self._requests.get(req_id)
        if state is None:
            if len(self._requests) >= self.max_requests:
                return False
            state = self._requests[req_id] = _DraftRequest(req_id)
        confirmed = 0
        new_tokens = history[state.num_computed_tokens :]
        while confirmed < min(len(state.drafts), len(new_tokens) - 1):
            if new_tokens[confirmed] != state.drafts[confirmed]:
                break
            confirmed += 1
        state.num_computed_tokens += confirmed
        state.drafts = []
        num_new_tokens = len(history) + cap - 1 - state.num_computed_tokens
        new_block_ids = self.block_manager.allocate_slots(state, num_new_tokens)
        if new_block_ids is None:
            return False
        state.block_ids += new_block_ids
        return True

    def _chunk(self, req_id: str, token_ids: list[int], start: int) -> ScheduledChunk:
        state = self._requests[req_id]
        new_blocks = state.block_ids[state.num_sent_blocks :]
        chunk = ScheduledChunk(req_id, token_ids, start, new_blocks, state.num_sent_blocks, True)
        state.num_sent_blocks = len(state.block_ids)
        return chunk

    def _first_drafts(self, rows: list) -> StepHandle:
        """One step over each row's uncomputed tokens, launched: each row's first draft."""
        chunks, new = [], []
        for _, req_id, history, _ in rows:
            state = self._requests[req_id]
            if not state.num_sent_blocks:
                new.append(NewRequestData(req_id, history, _GREEDY))
            start = state.num_computed_tokens
            chunks.append(self._chunk(req_id, history[start:], start))
        return self._launch(SchedulerOutput(chunks, 0, new, self._take_finished()))

    def _decode(self, rows: list[tuple[str, int]]) -> StepHandle:
        """One decode step, launched: (req_id, position) per row, whose token is the one the
        step before it (still running) samples for that request."""
        chunks = [self._chunk(req_id, [PLACEHOLDER_TOKEN_ID], pos) for req_id, pos in rows]
        return self._launch(SchedulerOutput(chunks, len(chunks), [], self._take_finished()))

    def _launch(self, sched_out: SchedulerOutput) -> StepHandle:
        with torch.inference_mode():
            return self.runner.sample(self.runner.forward(sched_out), None)

    def _take_finished(self) -> list[str]:
        finished, self._finished = self._finished, []
        return finished
