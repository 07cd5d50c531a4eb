"""Stacking: pack the products of one chunk into prompts of J products of one category.

Stacking is local to a chunk (no shuffle, no global groupby): within the chunk, products are grouped
by category in order of first appearance and cut into stacks of ``docs_per_prompt``; the leftovers
of a category form one smaller stack. The assignment depends only on the chunk's rows, so a retried
or resumed chunk is stacked the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpd_core.types import Product, Request

from pipelines.schema import AttributeSchema

NO_STACK = -1  # rows that are not sent to the model (rejected or skipped)


@dataclass(frozen=True)
class StackingConfig:
    """docs_per_prompt: J, the number of products of one category in one prompt."""

    docs_per_prompt: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.docs_per_prompt, int) or self.docs_per_prompt < 1:
            raise ValueError(f"docs_per_prompt must be a positive int, got {self.docs_per_prompt!r}")


def assign_stacks(categories: Sequence[str | None], config: StackingConfig) -> list[int]:
    """Stack id per row (``NO_STACK`` where the category is None); ids are 0.. in creation order."""
    stacks = [NO_STACK] * len(categories)
    open_stack: dict[str, tuple[int, int]] = {}  # category -> (stack id, rows in it)
    next_id = 0
    for position, category in enumerate(categories):
        if category is None:
            continue
        stack, filled = open_stack.get(category, (NO_STACK, config.docs_per_prompt))
        if filled == config.docs_per_prompt:
            stack, filled = next_id, 0
            next_id += 1
        stacks[position] = stack
        open_stack[category] = (stack, filled + 1)
    return stacks


def build_requests(
    stacks: Sequence[int], categories: Sequence[str | None], products: Sequence[Product | None], schema: AttributeSchema
) -> list[tuple[Request, list[int]]]:
    """One engine request per stack, with the row positions of its products (request order)."""
    members: dict[int, list[int]] = {}
    for position, stack in enumerate(stacks):
        if stack != NO_STACK:
            members.setdefault(stack, []).append(position)
    requests = []
    for stack in sorted(members):
        rows = members[stack]
        category = categories[rows[0]]
        request = Request(category, schema.attributes(category), tuple(products[r] for r in rows))
        requests.append((request, rows))
    return requests
