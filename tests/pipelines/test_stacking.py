from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from hpd_core.types import Product
from pipelines.schema import parse_schema
from pipelines.stacking import NO_STACK, StackingConfig, assign_stacks, build_requests


@given(st.lists(st.sampled_from(["A", "B", "C", None]), max_size=60), st.integers(1, 7))
def test_stacks_hold_one_category_at_most_j_and_one_leftover(categories, j):
    stacks = assign_stacks(categories, StackingConfig(j))
    members: dict[int, list[int]] = {}
    for position, (category, stack) in enumerate(zip(categories, stacks)):
        assert (stack == NO_STACK) == (category is None)
        if stack != NO_STACK:
            members.setdefault(stack, []).append(position)
    for rows in members.values():
        assert len({categories[r] for r in rows}) == 1
        assert 1 <= len(rows) <= j
    per_category = Counter(categories[rows[0]] for rows in members.values() if len(rows) < j)
    assert all(n == 1 for n in per_category.values())  # leftovers: one smaller stack per category
    for category in set(filter(None, categories)):
        total = categories.count(category)
        assert sum(1 for rows in members.values() if categories[rows[0]] == category) == -(-total // j)
    assert stacks == assign_stacks(categories, StackingConfig(j))  # deterministic


def test_build_requests_keeps_row_order_and_attributes():
    schema = parse_schema({"A": ["x", "y"], "B": ["z"]})
    categories = ["A", "B", None, "A", "A"]
    products = [Product(f"p{i}", f"t{i}") if c else None for i, c in enumerate(categories)]
    stacks = assign_stacks(categories, StackingConfig(2))
    requests = build_requests(stacks, categories, products, schema)
    assert [(r.category, [p.product_id for p in r.products], rows) for r, rows in requests] == [
        ("A", ["p0", "p3"], [0, 3]),
        ("B", ["p1"], [1]),
        ("A", ["p4"], [4]),
    ]
    assert [a.name for a in requests[0][0].attributes] == ["x", "y"]
