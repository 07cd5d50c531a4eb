"""Which products of a catalog to label first, for `hpd finetune --init-adapter` (`hpd pick`).

A few hundred labelled products of a catalog take the shipped adapter most of the way there
(README, Your own catalog). Which ones: each category gets a share of ``count`` in proportion to
its products, at least ``min_per_category`` (so that no category goes unseen), and within a
category a seeded random sample. Picking the products the model is least sure of instead was
measured and did not help (docs/quality.md, session 50): how much 45 labelled products give
varies more from one sample to the next (60 to 70 F1 on AE-110k) than between the ways of
choosing them, and at 200 the least sure scored 6 points below a random 200.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

@dataclass(frozen=True)
class SelectionConfig:
    """How many products to pick, and how."""

    count: int
    min_per_category: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be a positive int, got {self.count!r}")
        if not isinstance(self.min_per_category, int) or self.min_per_category < 0:
            raise ValueError(f"min_per_category must be an int >= 0, got {self.min_per_category!r}")


def quotas(sizes: Mapping[str, int], count: int, minimum: int, seed: int) -> dict[str, int]:
    """Products to pick per category: ``minimum`` each (all of a smaller category), and the rest of
    ``count`` in proportion to the categories' sizes (largest remainders first), never more than a
    category holds; what a category cannot take goes to those with the most left. Categories tied
    on a remainder (or on what they have left) are taken in an order drawn with ``seed``, not by
    name, so each seed may favour another of them. The sum is ``count``, or more where ``minimum``
    per category already exceeds it, or less where the categories hold fewer products."""
    if minimum < 0 or count < 0:
        raise ValueError(f"count and minimum must be >= 0, got {count} and {minimum}")
    order = sorted(sizes)
    random.Random(seed).shuffle(order)  # its own generator: the samples of ``select`` stay as they were
    rank = {c: i for i, c in enumerate(order)}  # the tie-break: lower first
    picked = {c: min(minimum, n) for c, n in sizes.items()}
    left = max(0, count - sum(picked.values()))
    total = sum(sizes.values()) or 1
    remainder = {c: left * n % total for c, n in sizes.items()}  # of left * n / total, in 1/total: exact, ties are ties
    for c, n in sizes.items():
        picked[c] += left * n // total
    rest = count - sum(picked.values())
    for c in sorted(sizes, key=lambda c: (-remainder[c], rank[c]))[: max(rest, 0)]:
        picked[c] += 1
    picked = {c: min(k, sizes[c]) for c, k in picked.items()}
    spare = count - sum(picked.values())
    while spare > 0 and any(picked[c] < n for c, n in sizes.items()):
        c = max(sizes, key=lambda c: (sizes[c] - picked[c], -rank[c]))
        picked[c] += 1
        spare -= 1
    return picked


def select(products: Sequence[tuple[str, str]], config: SelectionConfig) -> list[str]:
    """The product ids to label, in input order; ``products``: (product_id, category) in input order."""
    by_category: dict[str, list[str]] = {}
    for product_id, category in products:
        by_category.setdefault(category, []).append(product_id)
    wanted = quotas({c: len(ids) for c, ids in by_category.items()}, config.count, config.min_per_category,
                    config.seed)
    rng = random.Random(config.seed)
    chosen: set[str] = set()
    for category in sorted(by_category):
        chosen.update(rng.sample(by_category[category], wanted[category]))
    return [product_id for product_id, _ in products if product_id in chosen]
