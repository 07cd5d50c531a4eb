"""Attribute descriptions with example values, taken from the training targets.

``describe(products, attributes, k)`` gives each attribute the description ``e.g. "A", "B", ...``:
its ``k`` most frequent non-null target values among ``products`` (most frequent first, ties in
first-seen order; an existing description is kept in front: ``DESCRIPTION; e.g. ...``). An
attribute no product has a value for keeps its description as it was.

The prompt shows each attribute's description in the attribute list (``hpd_core.prompts``), which
every prompt of a category shares, so the examples cost one prefill per category and actor, not a
token per product. They show the model the form a category's values take ("6 M US", "Lace-Up",
"120 Count"), which the training targets follow. A model trained with them is extracted with the
same schema: ``hpd finetune --examples K`` writes it to ``OUT/attributes.json``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

from hpd_core.collate import Labeled
from hpd_core.types import Attribute

PREFIX = "e.g. "


def example_text(values: Iterable[str]) -> str:
    """``e.g. "A", "B"``: each value as a JSON string, so quotes and commas in it stay readable."""
    return PREFIX + ", ".join(json.dumps(v, ensure_ascii=False) for v in values)


def describe(
    products: Iterable[Labeled], attributes: dict[str, tuple[Attribute, ...]], k: int
) -> dict[str, tuple[Attribute, ...]]:
    """The schema with each attribute described by its ``k`` most frequent target values (a
    teacher's values below ``--min-confidence`` are no targets: ``Labeled.scored``)."""
    if k < 1:
        raise ValueError(f"the number of example values must be >= 1, got {k}")
    counts: dict[tuple[str, str], Counter[str]] = {}
    for product in products:
        scored = product.scored or (True,) * len(product.values)
        for attribute, value, target in zip(attributes[product.category], product.values, scored):
            if value is not None and target:
                counts.setdefault((product.category, attribute.name), Counter())[value] += 1
    described = {}
    for category, attrs in attributes.items():
        described[category] = tuple(_described(a, counts.get((category, a.name)), k) for a in attrs)
    return described


def _described(attribute: Attribute, counts: Counter[str] | None, k: int) -> Attribute:
    if not counts:
        return attribute
    examples = example_text(value for value, _ in counts.most_common(k))
    text = examples if not attribute.description else f"{attribute.description}; {examples}"
    return Attribute(attribute.name, text)


def schema_json(attributes: dict[str, tuple[Attribute, ...]]) -> dict[str, dict[str, str | None]]:
    """The schema file's form, ``{category: {attribute: description}}`` (``pipelines.schema``)."""
    return {category: {a.name: a.description for a in attrs} for category, attrs in attributes.items()}
