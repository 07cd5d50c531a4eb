"""ExtractGPT metric: exact reproduction of the stored runs, hand-computed cases, strict variant."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from evaluation.metrics import (
    Counts,
    GoldExample,
    Scores,
    classify,
    extractgpt_metric,
    gold_values,
    macro_scores,
    parse_extractgpt_prediction,
    score_counts,
    strict_metric,
)
from evaluation.scoring import evaluate_extractgpt_run

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
RUNS = sorted((SHARED / "data" / "extractgpt-runs").glob("*/*.gz"))


def test_all_ten_runs_are_present():
    assert len(RUNS) == 10, f"expected 10 stored ExtractGPT runs under {SHARED}/data/extractgpt-runs"


def _load_run(path: Path) -> tuple[dict, list[GoldExample], dict]:
    run = json.loads(gzip.decompress(path.read_bytes()))
    gold = [GoldExample(f"p{i}", ex["category"], ex["target_scores"]) for i, ex in enumerate(run["examples"])]
    preds = {f"p{i}": parse_extractgpt_prediction(ex["pred"]) for i, ex in enumerate(run["examples"])}
    return run, gold, preds


@pytest.mark.parametrize("path", RUNS, ids=[p.name[:60] for p in RUNS])
def test_reproduces_stored_run_exactly(path: Path):
    run, gold, preds = _load_run(path)
    report = extractgpt_metric(gold, preds, run["known_attributes"])
    stored = run["results"]
    assert {f"micro_{k}": v for k, v in report.micro.to_dict().items()} == stored["micro"]
    assert {f"macro_{k}": v for k, v in report.macro.to_dict().items()} == stored["macro"]
    per_combo = {f"{c.attribute}_{c.category}": c.scores.to_dict() for c in report.combos}
    assert per_combo == {k: v for k, v in stored.items() if k not in ("micro", "macro")}
    # the same through the CLI code path
    assert all(evaluate_extractgpt_run(str(path))["matches_stored"].values())


def test_macro_is_independent_of_combo_order():
    # this stored run has a macro F1 of exactly 67.745 in decimal: a plain float sum rounds it
    # to 67.74 or 67.75 depending on order; fsum always gives the stored 67.75.
    path = next(p for p in RUNS if "1_0___json_schema_ensembling_shuffle" in p.name and "ae_110k" in p.name)
    run, gold, preds = _load_run(path)
    scores = [c.scores for c in extractgpt_metric(gold, preds).combos]
    rng = random.Random(0)
    results = set()
    for _ in range(50):
        rng.shuffle(scores)
        results.add(macro_scores(scores))
    assert results == {Scores(71.29, 66.56, 67.75)}


# --- gold and prediction rules -----------------------------------------------------------------


def test_gold_values_first_key_decides_null_and_keys_are_stripped():
    assert gold_values({"n/a": 1, "Blue": 1}) == [None, "Blue"]
    assert gold_values({" Blue ": 1, "n/a": 1}) == ["Blue", None]
    assert gold_values({" n/a": 1}) == ["n/a"]  # only the exact key "n/a" is null
    with pytest.raises(ValueError, match="no values"):
        gold_values({})


@pytest.mark.parametrize(
    ("gold", "prediction", "outcome"),
    [
        ([None], None, "nn"),
        ([None], "n/a", "nn"),
        ([None], "None", "nn"),
        ([None], "Acme", "nv"),
        ([None, "Acme"], "Acme", "nv"),  # first key null: gold is null
        (["Acme"], None, "vn"),
        (["Acme"], "n/a", "vn"),
        (["Acme", None], None, "vn"),  # first key not null: gold has a value
        (["Acme"], "Acme", "vc"),
        (["Acme", "ACME Corp"], "ACME Corp", "vc"),
        (["Acme"], "acme", "vw"),  # no case folding
        (["Acme"], " Acme", "vw"),  # predictions are not stripped
        (["Acme"], "N/A", "vw"),  # only exact "n/a" / "None" are null
        (["5"], 5, "vw"),  # a non-string value never equals a gold string
        (["a"], ["a"], "vw"),
    ],
)
def test_classify(gold, prediction, outcome):
    assert classify(gold, prediction) == outcome


def test_parse_extractgpt_prediction():
    assert parse_extractgpt_prediction('{"Brand": "Acme", "Color": null}') == {"Brand": "Acme", "Color": None}
    assert parse_extractgpt_prediction("") == {}  # not JSON: every attribute null
    assert parse_extractgpt_prediction("Brand: Acme") == {}
    assert parse_extractgpt_prediction('["Brand"]') == {}  # JSON but not an object
    assert parse_extractgpt_prediction('"Brand"') == {}
    assert parse_extractgpt_prediction(None) == {}


# --- scores ------------------------------------------------------------------------------------


def test_score_counts_hand_computed():
    assert score_counts(Counts(vc=3, vw=1)) == Scores(75.0, 75.0, 75.0)
    assert score_counts(Counts(vc=1, nv=2)) == Scores(33.33, 100.0, 50.0)
    # F1 comes from the ROUNDED P and R: exact F1 would be 28.57
    assert score_counts(Counts(vc=1, vn=5)) == Scores(100.0, 16.67, 28.58)
    # Python round on the binary value: 1/32*100 = 3.125 exactly -> 3.12 (ties to even)
    assert score_counts(Counts(vc=1, nv=31)).precision == 3.12
    # empty denominators give 0
    assert score_counts(Counts(vn=2)) == Scores(0.0, 0.0, 0.0)
    assert score_counts(Counts(nv=2)) == Scores(0.0, 0.0, 0.0)
    assert score_counts(Counts()) == Scores(0.0, 0.0, 0.0)


def _gold() -> list[GoldExample]:
    return [
        GoldExample("a", "Shoes", {"Brand": {"Acme": 1}, "Color": {"Red": 1, "Crimson": 1}}),
        GoldExample("b", "Shoes", {"Brand": {"n/a": 1}, "Color": {"Blue": 1}}),
        GoldExample("c", "Shoes", {"Brand": {"Zed": 1}}),  # Color unannotated
        GoldExample("d", "Bags", {"Size": {"n/a": 1}}),  # only NN: no score
        GoldExample("e", "Shoes", {"Brand": {"Acme": 1}, "Color": {"Black": 1}}),
    ]


PREDS = {
    "a": {"Brand": "Acme", "Color": "Crimson", "Size": "XL"},  # VC, VC (Size not a Shoes attribute)
    "b": {"Brand": "Acme", "Color": None},  # NV, VN
    "c": {"Brand": "zed", "Color": "Green"},  # VW, (strict: NV)
    "d": {"Size": "n/a"},  # NN
    "e": {"Brand": "Acme", "Color": "Black"},  # VC, VC
}


def test_extractgpt_metric_hand_computed():
    report = extractgpt_metric(_gold(), PREDS)
    table = {(c.category, c.attribute): (c.counts, c.scores) for c in report.combos}
    assert table == {
        ("Shoes", "Brand"): (Counts(nv=1, vc=2, vw=1), Scores(50.0, 66.67, 57.14)),
        ("Shoes", "Color"): (Counts(vn=1, vc=2), Scores(100.0, 66.67, 80.0)),
    }  # (Bags, Size) has only NN and is left out
    assert report.counts == Counts(nv=1, vn=1, vc=4, vw=1)
    assert report.micro == Scores(66.67, 66.67, 66.67)
    assert report.macro == Scores(75.0, 66.67, 68.57)


def test_missing_product_and_attribute_count_as_null():
    report = extractgpt_metric(_gold(), {})
    assert report.counts == Counts(nn=1, vn=6)  # b's Brand is NN; (Bags, Size) has no score
    assert report.micro == Scores(0.0, 0.0, 0.0)


def test_strict_penalises_values_for_unannotated_attributes():
    lenient = extractgpt_metric(_gold(), PREDS)
    strict = strict_metric(_gold(), PREDS)
    color = next(c for c in strict.combos if c.attribute == "Color")
    assert color.counts == Counts(nv=1, vn=1, vc=2)  # product c: unannotated Color predicted "Green"
    assert strict.counts == Counts(nv=2, vn=1, vc=4, vw=1)
    assert strict.micro == Scores(57.14, 66.67, 61.54)
    assert lenient.micro.recall == strict.micro.recall  # strict adds gold-null pairs only


def test_strict_uses_schema_attributes_and_predicted_null_is_nn():
    schema = {"Shoes": ["Brand", "Color", "Material"], "Bags": ["Size", "Material"]}
    preds = {**PREDS, "c": {"Brand": "zed", "Color": None, "Material": "Leather"}, "d": {"Material": "None"}}
    strict = strict_metric(_gold(), preds, schema)
    table = {(c.category, c.attribute): c.counts for c in strict.combos}
    assert table[("Shoes", "Color")] == Counts(nn=1, vn=1, vc=2)
    assert table[("Shoes", "Material")] == Counts(nn=3, nv=1)
    assert ("Bags", "Material") not in table  # only NN
    lenient_keys = {(c.category, c.attribute) for c in extractgpt_metric(_gold(), preds, schema).combos}
    assert lenient_keys == {("Shoes", "Brand"), ("Shoes", "Color")}


def test_schema_only_orders_the_extractgpt_table():
    schema = {"Shoes": ["Color", "Brand"]}
    report = extractgpt_metric(_gold(), PREDS, schema)
    assert [c.attribute for c in report.combos] == ["Color", "Brand"]
    assert report.micro == extractgpt_metric(_gold(), PREDS).micro
