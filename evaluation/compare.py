"""Is run A better than run B on the same products? A paired bootstrap of the micro F1 difference.

The recipe search chooses between runs scored on one small held-out set (145 products): a point of
F1 there can be chance. Both runs' outcomes are tallied per product (the ExtractGPT metric's
counts, ``metrics.classify``), products are resampled with replacement (the same draw for both
runs: paired), and the micro F1 of each run is recomputed on every draw. The result is the observed
difference, a 95% percentile interval of the difference, and the share of draws in which A is ahead.
Micro F1 is the metric's own, rounded as the table rounds it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from datafiles.dataset import GoldExample
from evaluation.metrics import OUTCOMES, Counts, classify, gold_values, score_counts


def product_counts(examples: Sequence[GoldExample], predictions: Mapping[str, Mapping[str, object]]) -> list[tuple[int, ...]]:
    """Per product, in gold order: the (nn, nv, vn, vc, vw) counts over its annotated attributes."""
    rows = []
    for ex in examples:
        pred = predictions.get(ex.product_id, {})
        tally = dict.fromkeys(OUTCOMES, 0)
        for name, target in ex.target_scores.items():
            tally[classify(gold_values(target), pred.get(name))] += 1
        rows.append(tuple(tally[k] for k in OUTCOMES))
    return rows


def micro_f1(rows: Sequence[tuple[int, ...]]) -> float:
    """The ExtractGPT micro F1 of the products ``rows`` holds (``metrics.score_counts``)."""
    return score_counts(Counts(*(sum(column) for column in zip(*rows)))).f1 if rows else 0.0


@dataclass(frozen=True)
class Comparison:
    f1_a: float
    f1_b: float
    difference: float  # A - B
    low: float  # 2.5th percentile of the resampled difference
    high: float  # 97.5th percentile
    a_ahead: float  # share of draws with A's F1 above B's
    products: int
    draws: int


def compare(a: Sequence[tuple[int, ...]], b: Sequence[tuple[int, ...]], draws: int = 2000, seed: int = 0) -> Comparison:
    """Paired bootstrap of micro F1 (A - B) over products; ``a`` and ``b`` in the same product order."""
    if len(a) != len(b) or not a:
        raise ValueError(f"both runs need the same, non-empty products (got {len(a)} and {len(b)})")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    rng = random.Random(seed)
    n = len(a)
    differences = []
    for _ in range(draws):
        picks = [rng.randrange(n) for _ in range(n)]
        differences.append(micro_f1([a[i] for i in picks]) - micro_f1([b[i] for i in picks]))
    differences.sort()
    f1_a, f1_b = micro_f1(a), micro_f1(b)
    return Comparison(f1_a, f1_b, f1_a - f1_b, differences[int(0.025 * draws)],
                      differences[min(draws - 1, int(0.975 * draws))],
                      sum(d > 0 for d in differences) / draws, n, draws)
