"""hpd_core/reach.py: a CPU step's groups of queries and the ranges of entries they read cover
every entry each query may see, and split a row where that saves pairs."""

from __future__ import annotations

import random

import torch

from hpd_core.reach import cover_of, row_plan


def stacked_row(rng: random.Random, products: int, prompt: int, values: int) -> torch.Tensor:
    """(queries, entries) allowed for one row laid out as the engine's: the prompt (products'
    text in order) then the values written so far; product j's queries see the prompt up to their
    own key (and, with a window, its last part only), and some of the values."""
    per = prompt // products
    rows = []
    for j in range(products):
        for _ in range(rng.randint(1, 4)):
            seen = torch.zeros(prompt + values, dtype=torch.bool)
            end = (j + 1) * per - rng.randint(0, 3)
            seen[max(0, end - rng.randint(per, 3 * per)) : end] = True
            seen[prompt:] = torch.rand(values) < 0.5
            seen[prompt + rng.randrange(values)] = True  # its own entry
            rows.append(seen)
    return torch.stack(rows)


def test_groups_cover_what_their_queries_see_and_save_pairs():
    rng = random.Random(3)
    torch.manual_seed(3)
    rows = [stacked_row(rng, 6, 300, 40) for _ in range(3)]
    counts = [r.shape[0] for r in rows]
    A, C = max(counts), 340
    allowed = torch.zeros(3, A, C, dtype=torch.bool)
    for i, r in enumerate(rows):
        allowed[i, : r.shape[0]] = r
        allowed[i, r.shape[0] :, 0] = True  # padding queries: not the row's, never planned
    plans = row_plan(allowed, counts, call_pairs=16)  # calls priced low for rows this small
    for i, groups in enumerate(plans):
        assert [q0 for q0, _, _ in groups] == [0] + [q1 for _, q1, _ in groups[:-1]] and groups[-1][1] == counts[i]
        for q0, q1, ranges in groups:
            assert 1 <= len(ranges) <= 2 and all(a < b for a, b in ranges)
            inside = torch.zeros(C, dtype=torch.bool)
            for a, b in ranges:
                inside[a:b] = True
            assert not (allowed[i, q0:q1] & ~inside).any()  # nothing a query may see is left out
        computed = sum((q1 - q0) * sum(b - a for a, b in ranges) for q0, q1, ranges in groups)
        seen = allowed[i, : counts[i]]
        column = torch.arange(C)
        hull = int(torch.where(seen, column, -1).max()) + 1 - int(torch.where(seen, column, C).min())
        assert len(groups) > 1 and computed < 0.7 * counts[i] * hull  # the row's hull for every query: the old cost
    # a call priced very high: one range per row, from the first to the last entry any query sees
    for i, groups in enumerate(row_plan(allowed, counts, call_pairs=10**9)):
        seen = allowed[i, : counts[i]].any(0).nonzero().flatten()
        assert groups == [(0, counts[i], ((int(seen[0]), int(seen[-1]) + 1),))]


def test_cover_of_joins_overlaps_then_closes_the_smallest_gaps():
    assert cover_of(((5, 9), (0, 3), (8, 12))) == ((0, 3), (5, 12))
    assert cover_of(((0, 2), (4, 6), (20, 30), (40, 41))) == ((0, 6), (20, 41))
    assert cover_of(((1, 4),)) == ((1, 4),)
