"""Leakage between stacked products: values copied from another product of the same prompt.

HPD stacks J products of one category per prompt, taken in input order (``pipelines.stacking``), so
a product can share its prompt with the products up to ``w = J - 1`` places before or after it in
its category. A predicted value *leaks* when it is not in the product's own text but is in the text
of one of those neighbours ("Bob's Red Mill ... Granola, 12 Oz" answered "48 Packets" from the next
title). Generic words ("Men's", "Black") are in many titles, so the same share is measured against
a control: products of the same category ``4w + 1 .. 5w`` places away, which can never share the
prompt. The leakage figure is the difference of the two shares, over the non-null predicted values
of products that have control products:

    leakage = P(not own and in a neighbour) - P(not own and in a control product)

Each product is compared with as many neighbours as it has controls, the nearest of each: near the
ends of a small category (AE-110k has categories of 14-20 test products) a product has its
neighbours but fewer controls, or none, and counting them all would make the neighbours' share
larger by their number alone. (Until 2026-11-29 it did: one category of 49 products, each answering
a word of every other title, gave 18.37% at J = 8 with nothing copied; now 0.)

Text matching is case-insensitive substring search over title, description and features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from pipelines.schema import id_of


@dataclass(frozen=True)
class Leakage:
    window: int  # w: neighbours are up to w places away in their category's input order
    values: int  # non-null predicted values of products found in the records
    not_own: int  # of those, values absent from the product's own text
    compared: int  # values of products with control products (the shares' denominator)
    in_neighbour: int  # of those, not own, but in one of the product's compared neighbours' texts
    in_control: int  # not own, but in one of its control products' texts

    @property
    def percent(self) -> float | None:
        if not self.compared:
            return None
        return round(100 * (self.in_neighbour - self.in_control) / self.compared, 2)

    def to_dict(self) -> dict:
        share = (lambda n: round(100 * n / self.compared, 2)) if self.compared else (lambda n: None)
        return {
            **asdict(self),
            "neighbour_percent": share(self.in_neighbour),
            "control_percent": share(self.in_control),
            "leakage_percent": self.percent,
        }


def product_text(record: Mapping) -> str:
    parts = [record.get("title") or "", record.get("description") or "", *(record.get("features") or [])]
    return "\n".join(str(p) for p in parts).casefold()


def measure(
    predictions: Mapping[str, Mapping[str, object]],  # product_id -> attribute -> value
    records: Sequence[Mapping],  # the job's input rows, in input order
    docs_per_prompt: int,
) -> Leakage:
    if docs_per_prompt < 1:
        raise ValueError(f"docs_per_prompt must be >= 1, got {docs_per_prompt}")
    window = max(docs_per_prompt - 1, 1)
    by_category: dict[str, list[str]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(product_text(record))
    values = not_own = compared = in_neighbour = in_control = 0
    positions: dict[str, tuple[str, int]] = {}  # product_id -> (category, index in the category)
    seen: dict[str, int] = {}
    for record in records:
        category = record["category"]
        positions.setdefault(id_of(record["product_id"]), (category, seen.get(category, 0)))
        seen[category] = seen.get(category, 0) + 1
    for product_id, answer in predictions.items():
        if product_id not in positions:
            continue
        category, i = positions[product_id]
        texts = by_category[category]
        neighbours = _around(texts, i, 1, window)
        controls = _around(texts, i, 4 * window + 1, 5 * window)
        k = min(len(neighbours), len(controls))  # as many of each, the nearest (see the module doc)
        for value in answer.values():
            if value is None or not str(value).strip():
                continue
            values += 1
            compared += k > 0
            needle = str(value).casefold()
            if needle in texts[i]:
                continue
            not_own += 1
            if k:
                in_neighbour += any(needle in t for t in neighbours[:k])
                in_control += any(needle in t for t in controls[:k])
    return Leakage(window, values, not_own, compared, in_neighbour, in_control)


def _around(texts: Sequence[str], i: int, near: int, far: int) -> list[str]:
    """Texts ``near..far`` places before or after index ``i``, the nearest first."""
    return [texts[j] for d in range(near, far + 1) for j in (i - d, i + d) if 0 <= j < len(texts)]
