"""`hpd convert extractgpt`: round trip, stable ids, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.cli import main
from evaluation.convert import ConvertConfig, default_names, read_extractgpt

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
OA_MINE_TEST = SHARED / "data" / "oa-mine" / "test.jsonl"

TINY = [
    {"input": "Acme Runner Blue", "category": "Shoes", "target_scores": {"Brand": {"Acme": 1}, "Color": {"Blue": 1}}},
    {"input": "Plain Mug", "category": "Home & Kitchen/Bath", "target_scores": {"Brand": {"n/a": 1}}},
    {"input": "Zed Trail Shoe", "category": "Shoes", "target_scores": {"Shoe type": {"Trail": 1}, "Brand": {"Zed": 1}}},
]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_round_trip_tiny_inline(tmp_path: Path, capsys):
    source = tmp_path / "mini" / "test.jsonl"
    source.parent.mkdir()
    source.write_text("".join(json.dumps(row) + "\n" for row in TINY), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["convert", "extractgpt", str(source), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["records"] == 3 and summary["first_product_id"] == "mini-test-00000"

    records, gold = _read_jsonl(out / "records.jsonl"), _read_jsonl(out / "gold.jsonl")
    assert [r["product_id"] for r in records] == ["mini-test-00000", "mini-test-00001", "mini-test-00002"]
    assert records[1] == {"product_id": "mini-test-00001", "category": "Home & Kitchen/Bath", "title": "Plain Mug"}
    # gold + records reproduce the input exactly
    rebuilt = [
        {"input": r["title"], "category": g["category"], "target_scores": g["target_scores"]}
        for r, g in zip(records, gold)
    ]
    assert rebuilt == TINY
    assert [g["product_id"] for g in gold] == [r["product_id"] for r in records]
    attributes = json.loads((out / "attributes.json").read_text(encoding="utf-8"))
    assert attributes == {"Shoes": ["Brand", "Color", "Shoe type"], "Home & Kitchen/Bath": ["Brand"]}


def test_dataset_and_split_overrides(tmp_path: Path):
    source = tmp_path / "whatever.jsonl"
    source.write_text(json.dumps(TINY[0]) + "\n\n" + json.dumps(TINY[1]) + "\n", encoding="utf-8")
    assert main(["convert", "extractgpt", str(source), "--out", str(tmp_path / "o"), "--dataset", "ds", "--split", "dev"]) == 0
    ids = [r["product_id"] for r in _read_jsonl(tmp_path / "o" / "records.jsonl")]
    assert ids == ["ds-dev-00000", "ds-dev-00002"]  # the blank line keeps its index: ids stay stable
    with pytest.raises(ValueError, match="--dataset"):
        ConvertConfig(source, tmp_path, "", "dev")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ('{"category": "Shoes", "target_scores": {}}', "line 2: 'input' must be a non-empty string"),
        ('{"input": "x", "category": "", "target_scores": {}}', "line 2: 'category' must be a non-empty string"),
        ('{"input": "x", "category": "Shoes"}', "line 2: missing 'target_scores'"),
        ('{"input": "x", "category": "Shoes", "target_scores": {"Brand": "Acme"}}', r"line 2: target_scores\['Brand'\]"),
        ('{"input": "x", "category": "Shoes", "target_scores": {"Brand": {}}}', r"line 2: target_scores\['Brand'\]"),
        ('{"input": "bad \\ud800", "category": "Shoes", "target_scores": {"Brand": {"n/a": 1}}}',
         r"line 2: not valid Unicode \(surrogates not allowed: '\\ud800'\)"),
    ],
)
def test_malformed_lines_name_the_line(tmp_path: Path, line: str, message: str):
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps(TINY[0]) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_extractgpt(source, "d", "s")


def test_empty_file_is_an_error(tmp_path: Path):
    source = tmp_path / "empty.jsonl"
    source.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no records"):
        read_extractgpt(source, "d", "s")


def test_real_oa_mine_test_file(tmp_path: Path):
    assert default_names(OA_MINE_TEST) == ("oa-mine", "test")
    out = tmp_path / "oa"
    assert main(["convert", "extractgpt", str(OA_MINE_TEST), "--out", str(out)]) == 0
    records, gold = _read_jsonl(out / "records.jsonl"), _read_jsonl(out / "gold.jsonl")
    assert len(records) == len(gold) == 491
    assert records[0]["product_id"] == "oa-mine-test-00000"
    assert records[-1]["product_id"] == "oa-mine-test-00490"
    assert len({r["product_id"] for r in records}) == 491
    source = _read_jsonl(OA_MINE_TEST)
    assert [r["title"] for r in records] == [s["input"] for s in source]
    assert [g["target_scores"] for g in gold] == [s["target_scores"] for s in source]
    attributes = json.loads((out / "attributes.json").read_text(encoding="utf-8"))
    assert len(attributes) == 10
    assert attributes["Shoes"][:2] == ["Brand", "Gender"]
    # stable: a second conversion gives byte-identical files
    again = tmp_path / "again"
    main(["convert", "extractgpt", str(OA_MINE_TEST), "--out", str(again)])
    for name in ("records.jsonl", "gold.jsonl", "attributes.json"):
        assert (out / name).read_bytes() == (again / name).read_bytes()


def test_shipped_sample_is_the_converted_test_set(tmp_path: Path):
    """samples/: the quickstart's records and gold are what `hpd convert` writes for those products
    of OA-Mine test, line for line, and its schema covers their gold, so `hpd evaluate --gold samples/oa-mine-sample-gold.jsonl`
    scores the quickstart as the test set's gold would."""
    samples = Path(__file__).resolve().parents[2] / "samples"
    out = tmp_path / "oa"
    assert main(["convert", "extractgpt", str(OA_MINE_TEST), "--out", str(out)]) == 0
    records = {r["product_id"]: r for r in _read_jsonl(out / "records.jsonl")}
    gold = {g["product_id"]: g for g in _read_jsonl(out / "gold.jsonl")}
    sample = _read_jsonl(samples / "oa-mine-sample.jsonl")
    sample_gold = _read_jsonl(samples / "oa-mine-sample-gold.jsonl")
    assert len(sample) == 40
    assert [g["product_id"] for g in sample_gold] == [r["product_id"] for r in sample]
    assert sample == [records[r["product_id"]] for r in sample]
    assert sample_gold == [gold[r["product_id"]] for r in sample]
    schema = json.loads((samples / "attributes.json").read_text())  # OA-Mine train's attributes
    assert all(set(g["target_scores"]) <= set(schema[g["category"]]) for g in sample_gold)


def test_per_category_subset_keeps_ids_and_schema(tmp_path: Path, capsys):
    source = tmp_path / "mini" / "test.jsonl"
    source.parent.mkdir()
    source.write_text("".join(json.dumps(row) + "\n" for row in TINY), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["convert", "extractgpt", str(source), "--out", str(out), "--per-category", "1"]) == 0
    records, gold = _read_jsonl(out / "records.jsonl"), _read_jsonl(out / "gold.jsonl")
    assert [r["product_id"] for r in records] == ["mini-test-00000", "mini-test-00001"]  # first of each category
    assert [g["product_id"] for g in gold] == ["mini-test-00000", "mini-test-00001"]
    attributes = json.loads((out / "attributes.json").read_text(encoding="utf-8"))
    assert attributes["Shoes"] == ["Brand", "Color", "Shoe type"]  # from the whole file, as without the subset
    capsys.readouterr()
    assert main(["convert", "extractgpt", str(source), "--out", str(out), "--per-category", "0"]) == 2
    assert "per_category" in capsys.readouterr().err


def test_attribute_names_are_stripped(tmp_path: Path, capsys):
    """"Brand " is "Brand": one attribute in the schema and the gold, not a second one beside it."""
    rows = [
        {"input": "Acme Runner", "category": "Shoes", "target_scores": {"Brand ": {"Acme": 1}, " Color": {"Blue": 1}}},
        {"input": "Zed Shoe", "category": "Shoes", "target_scores": {"Brand": {"Zed": 1}, "Brand ": {"Zed": 1}}},
    ]
    source = tmp_path / "mini" / "test.jsonl"
    source.parent.mkdir()
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["convert", "extractgpt", str(source), "--out", str(out)]) == 0
    attributes = json.loads((out / "attributes.json").read_text(encoding="utf-8"))
    assert attributes == {"Shoes": ["Brand", "Color"]}
    gold = _read_jsonl(out / "gold.jsonl")
    assert [g["target_scores"] for g in gold] == [{"Brand": {"Acme": 1}, "Color": {"Blue": 1}}, {"Brand": {"Zed": 1}}]
    err = capsys.readouterr().err
    assert "hpd convert: warning: 3 attribute name(s) had surrounding whitespace" in err
    assert "kept once: mini-test-00001: 'Brand' and 'Brand '" in err  # same values: nothing lost


def test_stripped_names_with_different_values_are_an_error(tmp_path: Path, capsys):
    row = {"input": "Acme Runner", "category": "Shoes", "target_scores": {"Brand": {"Acme": 1}, "Brand ": {"Zed": 1}}}
    source = tmp_path / "mini" / "test.jsonl"
    source.parent.mkdir()
    source.write_text(json.dumps(TINY[0]) + "\n" + json.dumps(row) + "\n", encoding="utf-8")
    assert main(["convert", "extractgpt", str(source), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "line 2 (product mini-test-00001): attribute names 'Brand' and 'Brand ' are the same name 'Brand'" in err
    assert "different values ({'Acme': 1} and {'Zed': 1})" in err
    assert not (tmp_path / "out").exists()
