"""Planning prompts into sessions (hpd_core/batching.plan_sessions): prompts of similar row cost
share a session; a cheap prompt (a category's short last prompt) joins the session before it
where it adds no wave to that session (a row of its last wave stands free) and fits its rows as
they are, and decodes there as it does alone."""

from __future__ import annotations

import random

import pytest

from hpd_core.batching import plan_sessions, row_cost, session_rows
from hpd_core.config import DecodeConfig
from hpd_core.decoders import make_decoder
from hpd_core.types import Attribute, Product, Request

from .conftest import random_text
from .test_session import alone

K = 10


def test_prompts_within_half_the_first_cost_share_a_session_however_many_waves():
    # costs 100 + 10 x 10 = 200, then 150, 110: all at least half of 200; budget for 1 row only
    assert plan_sessions([100, 50, 10], [10, 10, 10], K, token_budget=200, max_rows=8) == [[0, 1, 2]]


def test_a_cheap_prompt_joins_where_it_adds_no_wave():
    lens, slots = [100, 100, 100, 20], [10, 10, 10, 2]  # costs 200, 200, 200, 40
    assert 2 * row_cost(20, 2, K) < row_cost(100, 10, K)
    # room for 4 rows of 200 entries: the cheap prompt takes the fourth
    assert plan_sessions(lens, slots, K, token_budget=800, max_rows=8) == [[0, 1, 2, 3]]
    assert session_rows(lens, slots, K, 800, 8) == 4
    # room for 3 rows: the three big prompts take them, so the cheap one waits in a session of its own
    assert plan_sessions(lens, slots, K, token_budget=799, max_rows=8) == [[0, 1, 2], [3]]
    # the same when the rows are capped by the batch size
    assert plan_sessions(lens, slots, K, token_budget=10_000, max_rows=3) == [[0, 1, 2], [3]]
    # 2 rows: the three big prompts take two waves, the second with a row free for the cheap one
    assert plan_sessions(lens, slots, K, token_budget=400, max_rows=8) == [[0, 1, 2, 3]]
    # four big prompts fill both waves
    assert plan_sessions([100] + lens, [10] + slots, K, token_budget=400, max_rows=8) == [[0, 1, 2, 3], [4]]


def test_a_cheap_prompt_that_would_widen_the_rows_keeps_a_session_of_its_own():
    # the first prompt has the most slots (cost 20 + 10 x 18 = 200), the cheap one a longer prompt
    # (cost 90): with it, every row would hold 90 + 10 x 18 entries, however roomy the budget
    assert plan_sessions([20, 90], [18, 0], K, token_budget=10_000, max_rows=8) == [[0], [1]]
    # more slots: fixed steps would feed 60 slots in every row (helper-57's case, smaller)
    lens, slots = [3000] * 4 + [400] * 4, [12] * 4 + [60] * 4  # costs 3,120 and 1,000
    assert plan_sessions(lens, slots, K, token_budget=2_000_000, max_rows=64) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_sessions_keep_every_prompt_once_most_costly_first():
    rng = random.Random(0)
    lens = [rng.randint(1, 300) for _ in range(200)]
    slots = [rng.randint(1, 40) for _ in range(200)]
    plan = plan_sessions(lens, slots, K, token_budget=20_000, max_rows=16)
    assert sorted(i for session in plan for i in session) == list(range(200))
    costs = [row_cost(n, s, K) for n, s in zip(lens, slots)]
    order = [costs[i] for session in plan for i in session]
    assert order == sorted(order, reverse=True)
    for session in plan:  # the cheap prompts (below half the first's cost) added no wave and widened no row
        cheap = [j for j, i in enumerate(session) if 2 * costs[i] < costs[session[0]]]
        if cheap:
            big = session[: cheap[0]]
            assert all(lens[i] <= max(lens[b] for b in big) and slots[i] <= max(slots[b] for b in big) for i in session[cheap[0]:])
            waves = [-(-len(part) // session_rows([lens[i] for i in part], [slots[i] for i in part], K, 20_000, 16))
                     for part in (big, session)]  # fmt: skip
            assert waves[1] <= waves[0]
    assert any(2 * costs[s[-1]] < costs[s[0]] for s in plan)  # the case arose


@pytest.mark.parametrize("step_shape", ["packed", "fixed"])
def test_a_short_last_prompt_decodes_in_the_same_session_as_alone(models, tokenizer, step_shape):
    rng = random.Random(3)
    attributes = tuple(Attribute(f"attr {i} {random_text(rng, 1)}") for i in range(8))
    requests = [Request("Shoes", attributes, tuple(Product(f"p{i}{j}", random_text(rng, 4)) for j in range(n)))
                for i, n in enumerate([4, 4, 4, 1])]  # fmt: skip
    config = DecodeConfig(max_value_tokens=20, max_batch_size=8, step_shape=step_shape, batch_token_budget=100_000)
    decoder = make_decoder("hpd", models["llama"], tokenizer, config)
    costs = [decoder.cost(layout) for layout in decoder.prepare(requests)]
    assert 2 * row_cost(*costs[3], 20) < row_cost(*costs[0], 20)  # the old rule gave it a session of its own
    batched = decoder.decode(requests)
    assert sum(decoder.runner.sessions.values()) == 1
    single = make_decoder("hpd", models["llama"], tokenizer, alone(config))
    for request, result in zip(requests, batched):
        expected = single.decode([request])[0]
        assert result.extra["slot_tokens"] == expected.extra["slot_tokens"]
        assert (result.values, result.forward_passes) == (expected.values, expected.forward_passes)
    # with rows for the three big prompts only, the short one waits for a session of its own
    capped = make_decoder("hpd", models["llama"], tokenizer, DecodeConfig(
        max_value_tokens=20, max_batch_size=3, step_shape=step_shape, batch_token_budget=100_000))  # fmt: skip
    assert [r.values for r in capped.decode(requests)] == [r.values for r in batched]
    assert sum(capped.runner.sessions.values()) == 2
