"""scripts/distinct_values.py: a value repeated under several attributes of a product, and what each
rule keeps of it, checked by hand."""

from __future__ import annotations


from datafiles.dataset import GoldExample
from tests.scripts import load_script



def _script():
    return load_script("distinct_values")


VALUES = {
    "l1": {"Brand": "Lenovo", "RAM": "8GB RAM", "Storage": " 8gb ram", "Color": "Grey", "Model": None},
    "l2": {"Brand": "ASUS", "RAM": "4GB", "Storage": "n/a", "Color": "n/a", "Model": None},
    "l3": {"Brand": "Apple", "RAM": "8GB", "Storage": "8GB", "Color": "8GB", "Model": "Air"},
}
GOLD = {
    "l1": GoldExample("l1", "Laptops", {"Brand": {"Lenovo": 1}, "RAM": {"8GB RAM": 1}, "Storage": {"512GB SSD": 1}}),
    "l2": GoldExample("l2", "Laptops", {"Brand": {"ASUS": 1}}),
    "l3": GoldExample("l3", "Laptops", {"RAM": {"16GB": 1}, "Storage": {"256GB": 1}}),
}
SCHEMA = {"Laptops": ["Brand", "Model", "Storage", "RAM", "Color"]}
CONFIDENCE = {"l1": {"RAM": 0.9, "Storage": 0.4}, "l3": {"RAM": 0.2, "Storage": 0.7, "Color": 0.1}}


def test_a_group_is_one_value_under_several_attributes_case_and_spaces_aside():
    groups = _script().groups
    assert groups(VALUES["l1"]) == [["RAM", "Storage"]]
    assert groups(VALUES["l2"]) == []  # the metric's null ("n/a") twice is no value
    assert groups(VALUES["l3"]) == [["RAM", "Storage", "Color"]]


def test_each_rule_keeps_one_value_of_a_group_and_makes_the_others_null():
    script = _script()
    rules = script.rules(VALUES, CONFIDENCE, GOLD, SCHEMA)
    kept = {}
    for name, rule in rules.items():
        values, nulled = script.distinct(VALUES, rule)
        assert values["l2"] == VALUES["l2"]  # no group: as it was
        assert {a: v for a, v in values["l1"].items() if a not in ("RAM", "Storage")} == {"Brand": "Lenovo", "Color": "Grey", "Model": None}
        kept[name] = ([a for a in ("RAM", "Storage") if values["l1"][a] is not None],
                      [a for a in ("RAM", "Storage", "Color") if values["l3"][a] is not None], nulled)
    assert kept == {
        "likeliest": (["RAM"], ["Storage"], 3),
        "first": (["Storage"], ["Storage"], 3),  # the schema's order: Storage before RAM and Color
        "last": (["RAM"], ["Color"], 3),
        "none": ([], [], 5),
        "oracle": (["RAM"], [], 4),  # l3: the gold has none of them
    }
    assert "likeliest" not in script.rules(VALUES, {}, GOLD, SCHEMA)  # a run without --confidence


def test_a_gold_that_repeats_a_value_is_counted():
    repeats = _script()._gold_repeats
    assert repeats({"Color": {"Black": 1}, "Frame color": {"black ": 1}})
    assert not repeats({"Color": {"Black": 1, "black": 1}, "Brand": {"n/a": 1}, "Size": {"n/a": 1}})
