"""The leakage figure: values copied from a product that could share the prompt, minus a control."""

from __future__ import annotations

import pytest

from evaluation.leakage import measure


def records(titles: list[str], category: str = "Food") -> list[dict]:
    return [{"product_id": f"p{i}", "category": category, "title": t} for i, t in enumerate(titles)]


def test_copied_value_counts_generic_word_cancels():
    titles = [f"Brand{i} Granola Black" for i in range(30)]
    titles[1] = "Bob's Red Mill Granola, 48 Packets Black"  # the neighbour of p0 (and of p2)
    rows = records(titles)
    predictions = {
        "p0": {"Brand": "Brand0", "Net content": "48 Packets"},  # own, then leaked from p1
        "p2": {"Brand": "Brand2", "Color": "Black", "Size": "12 oz"},  # own; generic (in own text); invented
        "p10": {"Color": "Granola Bar"},  # not own, in no other text: invented, not leaked
    }
    leak = measure(predictions, rows, docs_per_prompt=3)  # w = 2: p0 sees p1, p2; controls 9..10 away
    assert leak.window == 2 and leak.values == 6 and leak.not_own == 3
    assert leak.in_neighbour == 1 and leak.in_control == 0
    assert leak.percent == pytest.approx(100 / 6, abs=0.01)


def test_generic_value_in_neighbour_and_control_is_not_leakage():
    titles = ["Acme Shoe"] + ["Men's Sneaker"] * 30
    leak = measure({"p0": {"Gender": "Men's"}}, records(titles), docs_per_prompt=6)
    assert leak.in_neighbour == 1 and leak.in_control == 1 and leak.percent == 0.0


def test_neighbours_are_within_the_category_and_nulls_are_skipped():
    shoes = ["Acme Shoe", "Zeta Boot"] + [f"Shoe {i}" for i in range(8)]  # p0's control: p5
    rows = records(shoes, "Shoes") + records(["Zeta Tea"], "Tea")
    rows[-1]["product_id"] = "t0"
    leak = measure({"p0": {"Brand": "Zeta", "Color": None}, "t0": {"Brand": "Acme"}}, rows, docs_per_prompt=2)
    assert leak.values == 2 and leak.in_neighbour == 1  # p0 <- p1 (same category); t0 has no neighbour with Acme
    assert leak.compared == 1  # t0, alone in its category, has no control: not compared
    assert measure({}, rows, 2).percent is None


def test_products_without_enough_controls_do_not_inflate_the_figure():
    """Every product answers a word that is in every other title and not its own: neighbours and
    controls are alike by construction, so the figure is 0 whatever J, also where a small category
    leaves products near its ends with fewer controls than neighbours (or none)."""
    n = 49
    rows = records([" ".join(f"w{j}w" for j in range(n) if j != i) for i in range(n)])
    predictions = {f"p{i}": {"A": f"w{i}w"} for i in range(n)}
    for docs in (1, 2, 4, 6, 8, 12):
        leak = measure(predictions, rows, docs)
        assert leak.not_own == n and leak.in_neighbour == leak.in_control == leak.compared and leak.percent == 0.0
    tiny = measure({f"p{i}": {"A": f"w{i}w"} for i in range(14)}, rows[:14], 6)  # controls 21-25 away: none
    assert tiny.compared == 0 and tiny.percent is None
    with pytest.raises(ValueError):
        measure({}, rows, 0)
