"""The runner's per-request sampling state: params, output ids, seeded generators, and the
penalties' tables on the device (penalty_state.py).

It turns a step's rows into SamplingMetadata for the Sampler (with the per-step keys of the
Triton sampler's draws), their parameters gathered from the requests' slots of a RowTable
(row_table.py); logprob_packing.py reads the sampler's logprobs back.
Nothing it builds for a step needs the step before's tokens on the host, but for bad words
and thinking budgets (reads_output): penalties count sampled tokens on the device (record),
min_tokens counts rows built.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from minivllm.engine.runner.device_inputs import InputStaging
from minivllm.engine.runner.sampling.penalty_state import PenaltyState
from minivllm.engine.runner.sampling.request_state import (
    FLOAT_PARAMS,
    RequestState,
    follows_output,
    new_state,
)
from minivllm.engine.runner.sampling.row_edits import (
    allowed_token_ids,
    forced_token_ids,
    logit_bias,
    suppressed_token_ids,
)
from minivllm.engine.runner.sampling.row_table import RowTable, StepRows
from minivllm.engine.runner.sampling.thinking_budget import ThinkingBudget
from minivllm.engine.types import NewRequestData
from minivllm.layers.dispatch import use_triton_kernels
from minivllm.layers.sampler import DRAW_SHIFT, SamplingMetadata
from minivllm.layers.sampling_filters import can_filter_by_candidates


class SamplingState:
    """What the runner remembers per request to sample it; keyed by req_id.

    Randomness of the Triton sampler (on CUDA: every batch with random rows): a row's draw
    depends only on its key (seed, offset). A seeded request uses (params.seed, num_sampled <<
    32), so it repeats its tokens alone or in any batch. Unseeded rows share one fresh 63-bit
    seed per step, drawn on the CPU from a generator seeded with `seed`, and use offset row <<
    32 (distinct per row). The torch sampler (CPU) uses per-request torch generators for seeded
    rows; plain batches get keys there too (the Triton sampler in tests).
    """

    def __init__(
        self,
        device: torch.device | str,
        seed: int = 0,
        max_num_seqs: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """max_num_seqs, vocab_size: the penalty tables' size, allocated now (the engine);
        None: grown as requests need (the sampler's tests)."""
        self.device = torch.device(device)
        self.keyed_draws = use_triton_kernels(self.device)
        self.requests: dict[str, RequestState] = {}
        # Their parameters by slot (RequestState.slot), gathered a step at a time.
        self.table = RowTable(max_num_seqs or 64)
        self._num_seeded = 0  # requests with a seeded generator (random rows draw from it)
        self.penalties = PenaltyState(self.device, max_num_seqs, vocab_size)
        self._step_generator = torch.Generator().manual_seed(seed)
        # (req_ids, metadata, gathered rows) of the last step, when it can be reused as is.
        self._reusable: tuple[tuple[str, ...], SamplingMetadata, StepRows] | None = None
        # Up to three uploads a step (parameters and penalty rows when the batch changes,
        # draw keys).
        self._staging = InputStaging(self.device, num_slots=8, capacity=1 << 14)
        # Requests with bad words or a thinking budget: their banned or forced tokens follow
        # the output, step by step.
        self._num_following_output = 0

    def add_request(self, new: NewRequestData) -> None:
        """Registers a request. A req_id already known keeps its state (outputs, generator)."""
        if new.req_id in self.requests:
            return
        params = new.sampling_params
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        state = new_state(new, generator)
        if params.thinking_token_budget is not None:
            start_ids, end_ids = params.think_marker_ids
            state.thinking = ThinkingBudget.after_prompt(
                params.thinking_token_budget, start_ids, end_ids, state.prompt_token_ids
            )
        state.slot = self.table.add(state)
        self.requests[new.req_id] = state
        self._num_following_output += follows_output(state)
        self._num_seeded += generator is not None

    def remove(self, req_id: str) -> None:
        state = self.requests.pop(req_id, None)
        if state is not None:
            self._num_following_output -= follows_output(state)
            self._num_seeded -= state.generator is not None
            self.table.remove(state.slot)
            self.penalties.release(req_id)

    def append_tokens(self, req_ids: list[str], token_ids: list[int]) -> None:
        """Records a step's tokens; requests removed meanwhile (async scheduling) are skipped."""
        requests, penalties = self.requests, self.penalties
        for req_id, token_id in zip(req_ids, token_ids, strict=True):
            state = requests.get(req_id)
            if state is not None:
                state.output_token_ids.append(token_id)
                if state.has_penalties:  # only these hold a penalty slot
                    penalties.count_appended(req_id, len(state.output_token_ids), token_id)

    def build_metadata(
        self, req_ids: list[str], drafted: list[list[int]] | None = None
    ) -> SamplingMetadata:
        """SamplingMetadata for rows req_ids (one row per sampled position, in order).

        Each row is one sampled token: it advances its request's num_sampled. A request with
        drafts has one row per position, consecutive, each keyed as the token it would be
        without speculation; unsample() takes back the rows of rejected positions.
        drafted: per row, the drafts before its position, which penalties count and
        min_tokens counts as output (the row is sampled as if they had been).
        """
        key = tuple(req_ids)
        states = [self.requests[req_id] for req_id in req_ids]
        draw_index = []
        for s in states:
            draw_index.append(s.num_sampled)
            s.num_sampled += 1
        reusable = self._reusable
        if (
            reusable is not None
            and reusable[0] == key
            and drafted is None
            and reusable[1].output_counts in (None, self.penalties.output_counts)
        ):
            _, meta, rows = reusable
        else:
            slots = np.fromiter((s.slot for s in states), np.int64, len(states))
            rows = self.table.gather(slots)
            meta = self._build_metadata(req_ids, states, rows, draw_index, drafted)
            # Without suppressed tokens, bad words or thinking budgets nothing in it changes
            # while the batch stays, except the draw keys (replaced below): penalties read
            # tables that the device keeps up to date.
            static = meta.suppressed_token_ids is None and not self._num_following_output
            self._reusable = (key, meta, rows) if static else None
        # The Triton sampler draws every batch with keyed noise (plain or not), so that a
        # seeded request's tokens do not depend on its neighbours' sampling options.
        if (meta.is_plain or self.keyed_draws) and not meta.all_greedy:
            meta = replace(meta, **self._draw_tensors(rows, draw_index))
        return meta

    def unsample(self, req_id: str, num_rows: int) -> None:
        """Takes back the last num_rows sampled rows of req_id (drafted positions past a
        rejection), so that its next token gets the key it gets without speculation."""
        state = self.requests.get(req_id)
        if state is not None:
            state.num_sampled -= num_rows

    def generator_states(self, req_ids: list[str]) -> dict[str, torch.Tensor]:
        """The generator state of each seeded random request among req_ids, where draws come
        from generators (not keyed): what replay_draws rewinds to."""
        if self.keyed_draws:
            return {}
        states = {r: self.requests[r] for r in req_ids}
        return {
            r: s.generator.get_state()
            for r, s in states.items()
            if s.generator is not None and not s.params.is_greedy
        }

    def replay_draws(
        self, req_id: str, generator_state: torch.Tensor, num_draws: int, vocab_size: int
    ) -> None:
        """Sets req_id's generator to generator_state advanced by num_draws row draws (the
        sampler's exponential_race draws [vocab_size] per row): where it is after the
        positions kept, without those of rejected drafts."""
        state = self.requests.get(req_id)
        if state is None:
            return
        generator = state.generator
        generator.set_state(generator_state)
        scratch = torch.empty(vocab_size, dtype=torch.float32, device=self.device)
        for _ in range(num_draws):
            scratch.exponential_(generator=generator)

    def _draw_tensors(self, rows: StepRows, draw_index: list[int]) -> dict[str, torch.Tensor]:
        """This step's draw keys: seeds and offsets [N] int64 (one transfer)."""
        # Drawn only when a row needs it: a step of seeded requests leaves the generator as it
        # was (the engine's warm-up relies on it; engine/warm_up.py).
        step_seed = 0
        if not rows.seeded.all():
            step_seed = int(torch.randint(2**63 - 1, (), generator=self._step_generator))
        seeded = rows.seeded
        seeds = np.where(seeded, rows.seed, step_seed)  # SamplingParams keeps seeds in int64
        offsets = np.arange(len(seeded), dtype=np.int64)
        if seeded.any():
            offsets = np.where(seeded, np.asarray(draw_index, np.int64), offsets)
        return self._staging.upload({"seeds": seeds, "offsets": offsets << DRAW_SHIFT})

    def reads_output(self, req_id: str) -> bool:
        """Whether req_id's sampling depends on its output so far: penalties, min_tokens not
        reached, bad words, a thinking budget (its rows with drafts need build_metadata's
        drafted)."""
        s = self.requests[req_id]
        return (
            s.params.has_penalties
            or len(s.output_token_ids) < s.params.min_tokens
            or follows_output(s)
        )

    def _build_metadata(
        self,
        req_ids: list[str],
        states: list[RequestState],
        rows: StepRows,
        draw_index: list[int],
        drafted: list[list[int]] | None = None,
    ) -> SamplingMetadata:
        device, num_rows = self.device, len(states)
        forced = forced_token_ids(states, drafted) if self._num_following_output else None
        suppressed_ids = None
        # A row's output before it is at least the rows built before it (drafts only add):
        # past min_tokens of those, it bans nothing.
        early = rows.banned_until.any() and (np.asarray(draw_index) < rows.banned_until).any()
        if early or self._num_following_output:
            suppressed_ids = self._suppressed(states, draw_index, drafted, forced)
        bias_ids = bias_values = allowed_ids = allowed_rows = None
        if rows.edited or forced is not None:
            params = [s.params for s in states]
            bias_ids, bias_values = logit_bias(params, device)
            allowed_ids, allowed_rows = allowed_token_ids(params, device, forced)
        arrays = {"floats": rows.floats.T.copy(), "top_k": rows.top_k}  # floats [6, N]
        # The rows that asked for logprobs, where not all did: only they take a log_softmax.
        if 0 < len(rows.logprob_rows) < num_rows:
            arrays["logprob_rows"] = rows.logprob_rows
        penalized = rows.penalized.tolist()
        penalties = self._penalty_arrays(req_ids, penalized, drafted, arrays)
        dev = self._staging.upload(arrays)
        tensors = dict(zip(FLOAT_PARAMS, dev["floats"].unbind(0), strict=True))
        tensors["top_k"] = dev["top_k"]
        if penalized:
            penalties |= {
                "penalty_rows": dev["penalty_rows"],
                "penalty_slots": dev["penalty_slots"],
                "penalty_drafts": dev.get("penalty_drafts"),
                "penalty_row_slots": dev.get("penalty_row_slots"),
            }
        filters = _filter_fields(rows)
        num_random = int(rows.random.sum())
        is_plain = (
            penalties["no_penalties"]
            and suppressed_ids is None
            and bias_ids is None
            and allowed_ids is None
            and not len(rows.logprob_rows)
            and filters["no_top_k"] and filters["no_top_p"] and filters["no_min_p"]
        )  # fmt: skip
        # Greedy rows never draw, so an all-greedy batch that the Triton draw takes (plain, or
        # with penalties it reads: Sampler.penalties_on_read) keeps zeros; for the others
        # build_metadata puts in each step's seeds and offsets.
        draws = None
        if not num_random and (is_plain or "penalty_row_slots" in dev):
            draws = torch.zeros(2, num_rows, dtype=torch.int64, device=device)
        generators = {}
        if self._num_seeded:
            generators = {
                row: s.generator
                for row, s in enumerate(states)
                if s.generator is not None and s.is_random
            }
        return SamplingMetadata(
            **tensors,
            **filters,
            **penalties,
            suppressed_token_ids=suppressed_ids,
            generators=generators,
            all_greedy=not num_random,
            all_random=num_random == num_rows,
            max_num_logprobs=int(rows.num_logprobs.max()) if len(rows.num_logprobs) else None,
            logprob_rows=dev.get("logprob_rows"),
            logit_bias_ids=bias_ids,
            logit_bias_values=bias_values,
            allowed_token_ids=allowed_ids,
            allowed_rows=allowed_rows,
            is_plain=is_plain,
            seeds=None if draws is None else draws[0],
            offsets=None if draws is None else draws[1],
        )

    def _suppressed(
        self,
        states: list[RequestState],
        draw_index: list[int],
        drafted: list[list[int]] | None,
        forced: list[int | None] | None,
    ) -> torch.Tensor | None:
        """suppressed_token_ids of the step's rows: min_tokens' bans by each row's output
        tokens before it (the rows built so far, the tokens of steps still in flight included,
        or, where more, the recorded output and the drafts before it), and bad words' bans by
        those tokens where some request has bad words."""
        num_before = [
            max(index, len(s.output_token_ids) + (len(drafted[row]) if drafted else 0))
            for row, (index, s) in enumerate(zip(draw_index, states, strict=True))
        ]
        outputs = None  # per row, the output before it: only bad words read it
        if self._num_following_output:
            outputs = [s.output_token_ids for s in states]
            if drafted is not None:
                outputs = [out + before for out, before in zip(outputs, drafted, strict=True)]
        return suppressed_token_ids(states, num_before, outputs, self.device, forced)

    def _penalty_arrays(
        self,
        req_ids: list[str],
        rows: list[int],
        drafted: list[list[int]] | None,
        arrays: dict[str, np.ndarray],
    ) -> dict:
        """The penalized rows' arrays for the step's upload (added to arrays: the rows, their
        requests' slots of the penalty tables, filled where new, and in a drafted step each
        row's drafts before it, padded with -1, else for the Triton sampler each row's slot,
        -1 where none), and the SamplingMetadata fields that need no upload."""
        if not rows:
            return {"no_penalties": True}
        row_req_ids = [req_ids[row] for row in rows]
        if drafted is None:  # one row a request
            slots = self.penalties.slots_for(row_req_ids, self._tokens_of)
        else:  # a request's rows are its positions
            unique = list(dict.fromkeys(row_req_ids))
            unique_slots = self.penalties.slots_for(unique, self._tokens_of)
            slot_of = dict(zip(unique, unique_slots, strict=True))
            slots = [slot_of[r] for r in row_req_ids]
        arrays["penalty_rows"] = np.array(rows, np.int64)
        arrays["penalty_slots"] = np.array(slots, np.int64)
        if drafted is None and self.keyed_draws:  # the Triton filters and draw read them
            row_slots = np.full(len(req_ids), -1, np.int64)
            row_slots[arrays["penalty_rows"]] = arrays["penalty_slots"]
            arrays["penalty_row_slots"] = row_slots
        if drafted is not None:
            width = max(1, max(len(drafted[row]) for row in rows))
            arrays["penalty_drafts"] = np.array(
                [drafted[row] + [-1] * (width - len(drafted[row])) for row in rows], np.int64
            )
        return {
            "no_penalties": False,
            "penalty_req_ids": row_req_ids if drafted is None else None,
            "output_counts": self.penalties.output_counts,
            "prompt_mask": self.penalties.prompt_mask,
        }

    def _tokens_of(self, req_id: str) -> tuple[list[int], list[int]]:
        """A request's (prompt, output) token ids: what a new penalty slot is filled from."""
        state = self.requests[req_id]
        return state.prompt_token_ids, state.output_token_ids

    def record_sampled(self, meta: SamplingMetadata, sampled_token_ids: torch.Tensor) -> None:
        """Counts a plain step's sampled ids [N] (on the device) in its penalized rows' slots,
        so that the next step's penalties see them before they reach the host."""
        if meta.penalty_req_ids is not None:
            tokens = sampled_token_ids[meta.penalty_rows]
            self.penalties.record(meta.penalty_slots, tokens, meta.penalty_req_ids)

    def record_rows(self, req_ids: list[str], rows: list[int], token_ids: torch.Tensor) -> None:
        """Counts token_ids[rows] (sampled on the device; one row per request, distinct) in
        the penalty slots of those of req_ids that have one, as record_sampled does for a
        plain step: a drafted step's requests without drafts (the next step, launched before
        this one is read, may sample them again)."""
        slots = self.penalties.slots
        counted = [(req_id, row) for req_id, row in zip(req_ids, rows, strict=True)
                   if req_id in slots]  # fmt: skip
        if not counted:
            return
        dev = self._staging.upload({
            "rows": np.array([row for _, row in counted], np.int64),
            "slots": np.array([slots[req_id] for req_id, _ in counted], np.int64),
        })  # fmt: skip
        self.penalties.record(dev["slots"], token_ids[dev["rows"]], [r for r, _ in counted])

    def num_logprobs(self, req_ids: list[str]) -> list[int | None]:
        """Per row: how many top logprobs the request asked for (None: no logprobs)."""
        return [self.requests[req_id].params.logprobs for req_id in req_ids]


def _filter_fields(rows: StepRows) -> dict:
    """SamplingMetadata's filter flags from the random rows' top_k, top_p and min_p."""
    random = rows.random
    top_k, top_p, min_p = rows.top_k[random], rows.top_p[random], rows.min_p[random]
    return {
        "no_top_k": not top_k.any(),
        "no_top_p": bool((top_p == 1.0).all()),
        "no_min_p": bool((min_p == 0.0).all()),
        "max_top_k": int(top_k.max()) if len(top_k) else 0,
        "filter_by_candidates": can_filter_by_candidates(top_k, top_p),
    }
