"""scripts/error_kinds.py: the kind of each value the metric counts wrong, counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

from pyarrow import fs

from tests.scripts import load_script

from .test_evaluate import BATH, gold_dir, write_predictions  # noqa: F401 (gold_dir: a fixture)



def _script():
    return load_script("error_kinds")


def test_kind_of_each_wrong_value(tmp_path: Path, gold_dir: Path):
    """The fixture's wrong values: "Gray" for "Grey" (another span), "zed" for "Zed" (case), and
    the never-predicted Plain Sock's brand (null); "Soft" for a null gold and Kiddo's unannotated
    Color are not counted, as the metric does not count them. A training gold where "Gray" is a
    Bath Color makes that value the training's convention; the fixture's own products are left out
    of the training values even when the training gold holds them."""
    errors = _script()
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    train = tmp_path / "train-gold.jsonl"
    rows = [{"product_id": "train-1", "category": BATH, "target_scores": {"Color": {"Gray": 1}, "Brand": {"Acme": 1}}},
            {"product_id": "tiny-test-00002", "category": "Shoes", "target_scores": {"Brand": {"zed": 1}}}]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = errors.error_kinds(str(out), gold_dir, train, examples=1)
    assert result["scored_values"] == 7 and result["wrong"] == 3  # VC 4, VW 2, VN 1
    assert result["kinds"] == {"case": 1, "too short": 0, "too long": 0, "overlapping": 0, "another span": 1, "null": 1}
    assert result["decoded_is_a_training_value"]["another span"] == 1  # "Gray": a training Bath Color
    assert result["decoded_is_a_training_value"]["case"] == 0  # "zed" only in a left-out product's gold
    assert result["gold_is_a_training_value"]["another span"] == 0
    assert result["examples"]["another span"] == [{"attribute": "Color", "gold": "Grey", "decoded": "Gray"}]
    assert errors.kind_of("Kimbo Espresso", "kimbo") == "too short"
    assert errors.kind_of("Nestle", "Nestle Cerelac") == "too long"
    assert errors.kind_of("French Roast", "Dark Roast") == "overlapping"
