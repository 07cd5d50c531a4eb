"""Attribute descriptions with example values (training/examples.py)."""

from __future__ import annotations

import json

import pytest

from hpd_core.collate import Labeled
from hpd_core.types import Attribute, Product
from pipelines.schema import parse_schema
from training.examples import describe, example_text, schema_json

ATTRIBUTES = {
    "Shoes": (Attribute("Brand"), Attribute("Size", "shoe size"), Attribute("Heel")),
    "Tea": (Attribute("Flavor"),),
}


def labeled(category: str, *values: str | None) -> Labeled:
    return Labeled(category, Product("p", "title"), values)


PRODUCTS = [
    labeled("Shoes", "Acme", "10 M US", None),
    labeled("Shoes", "Nike", "7 M US", None),
    labeled("Shoes", "Acme", "7 M US", None),
    labeled("Shoes", 'Say "Hi", Co', None, None),
    labeled("Tea", "Mint"),
]


def test_most_frequent_values_first_ties_in_first_seen_order():
    described = describe(PRODUCTS, ATTRIBUTES, 2)
    brand, size, heel = described["Shoes"]
    assert brand == Attribute("Brand", 'e.g. "Acme", "Nike"')  # Acme twice; Nike seen before the quoted one
    assert size == Attribute("Size", 'shoe size; e.g. "7 M US", "10 M US"')  # a description is kept in front
    assert heel == Attribute("Heel")  # no value in any product: unchanged
    assert described["Tea"] == (Attribute("Flavor", 'e.g. "Mint"'),)


def test_a_teachers_unsure_values_describe_nothing():
    """Values that are no targets (``Labeled.scored``: below a teacher's floor) are not examples."""
    sure = Labeled("Shoes", Product("p", "title"), ("Acme", "7 M US", None), (True, False, False))
    unsure = [Labeled("Shoes", Product(f"q{i}", "title"), ("Sneaker", "9", None), (False, True, False)) for i in range(3)]
    brand, size, _ = describe([sure, *unsure], ATTRIBUTES, 2)["Shoes"]
    assert brand == Attribute("Brand", 'e.g. "Acme"') and size == Attribute("Size", 'shoe size; e.g. "9"')


def test_values_are_json_strings_and_k_caps_the_list():
    brand = describe(PRODUCTS, ATTRIBUTES, 5)["Shoes"][0]
    assert brand.description == 'e.g. "Acme", "Nike", "Say \\"Hi\\", Co"'
    assert example_text(["Crème"]) == 'e.g. "Crème"'  # not escaped to \\u codes


def test_schema_file_round_trip_and_bad_k():
    described = describe(PRODUCTS, ATTRIBUTES, 3)
    text = json.dumps(schema_json(described))
    assert parse_schema(json.loads(text)).categories == described
    with pytest.raises(ValueError, match=">= 1"):
        describe(PRODUCTS, ATTRIBUTES, 0)
