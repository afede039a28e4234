"""RowTable: a step's gathered rows hold each request's own parameters, read from its
SamplingParams, through slots given back and reused, the table's growth, and requests holding
several rows (a drafted step's positions)."""

from __future__ import annotations

import random

import numpy as np

from minivllm.engine.runner.sampling.request_state import FLOAT_PARAMS, new_state
from minivllm.engine.runner.sampling.row_table import RowTable
from minivllm.engine.types import NewRequestData
from minivllm.sampling_params import SamplingParams


def random_params(rng: random.Random) -> SamplingParams:
    options: dict = {"temperature": rng.choice([0.0, 0.7, 1.0])}
    if rng.random() < 0.5:
        options |= {"top_k": rng.choice([0, 20, 2000]), "top_p": rng.choice([1.0, 0.8, 0.95])}
    if rng.random() < 0.3:
        options["min_p"] = 0.05
    if rng.random() < 0.3:
        options["repetition_penalty"] = 1.05
    if rng.random() < 0.2:
        options["presence_penalty"] = 0.5
    if rng.random() < 0.3:
        options["logprobs"] = rng.choice([0, 5])
    if rng.random() < 0.3:
        options["min_tokens"] = 4
    if rng.random() < 0.5:
        options["stop_token_ids"] = [7]
    if rng.random() < 0.2:
        options["seed"] = rng.randrange(2**40)
    if rng.random() < 0.1:
        options["logit_bias"] = {3: 1.0}
    if rng.random() < 0.1:
        options["allowed_token_ids"] = [1, 2, 3]
    return SamplingParams(ignore_eos=rng.random() < 0.5, **options)


def test_gathered_rows_are_each_requests_own_parameters() -> None:
    rng = random.Random(0)
    table = RowTable(capacity=4)  # grows past it
    live = {}
    for i in range(200):
        if live and rng.random() < 0.4:  # a slot given back, to be reused
            table.remove(live.pop(rng.choice(sorted(live))).slot)
        state = new_state(NewRequestData(f"r{i}", [1, 2, 3], random_params(rng)), None)
        state.slot = table.add(state)
        live[f"r{i}"] = state
    assert len({s.slot for s in live.values()}) == len(live)
    names = sorted(live)
    rows = [live[n] for n in rng.choices(names, k=300)]  # repeats: a request's several rows
    got = table.gather(np.array([s.slot for s in rows], np.int64))
    params = [s.params for s in rows]
    expected_floats = [[getattr(p, name) for name in FLOAT_PARAMS.values()] for p in params]
    np.testing.assert_array_equal(got.floats, np.array(expected_floats, np.float32))
    assert got.top_k.tolist() == [p.top_k for p in params]
    assert got.top_p.tolist() == [p.top_p for p in params]
    assert got.min_p.tolist() == [p.min_p for p in params]
    assert got.random.tolist() == [not p.is_greedy for p in params]
    assert got.penalized.tolist() == [i for i, p in enumerate(params) if p.has_penalties]
    asked = [i for i, p in enumerate(params) if p.logprobs is not None]
    assert got.logprob_rows.tolist() == asked
    assert got.num_logprobs.tolist() == [params[i].logprobs for i in asked]
    bans = [list(p.stop_token_ids) + ([] if p.ignore_eos else list(p.eos_token_ids))
            for p in params]  # fmt: skip
    banned = [p.min_tokens if ids else 0 for p, ids in zip(params, bans, strict=True)]
    assert 0 < sum(map(bool, banned)) < len(banned)
    assert got.banned_until.tolist() == banned
    assert got.seeded.tolist() == [p.seed is not None for p in params]
    assert [s for s, p in zip(got.seed.tolist(), params) if p.seed is not None] == [
        p.seed for p in params if p.seed is not None
    ]
    assert got.edited == any(p.logit_bias or p.allowed_token_ids for p in params)
