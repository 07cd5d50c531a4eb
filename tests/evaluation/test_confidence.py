"""`hpd evaluate` on an output with confidences (`hpd extract --confidence`): both metrics again with
the values below each threshold read as null, counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

from datafiles.dataset import read_gold
from datafiles.predictions import read_columns, read_predictions
from evaluation.confidence import by_confidence, kept
from jobs.cli import main
from tests.scripts import load_script

from .test_evaluate import SCHEMA, _rows, gold_dir, write_predictions  # noqa: F401 (gold_dir: a fixture)

# the predictions of test_evaluate (gold outcome in the comment), each with a confidence
CONFIDENCE = {
    (0, "Brand"): 0.95,  # Acme: VC
    (0, "Color"): 0.6,  # Navy: VC
    (1, "Brand"): 0.3,  # Soft where the gold is n/a: NV
    (1, "Color"): 0.85,  # Gray for Grey: VW
    (2, "Brand"): 0.4,  # zed for Zed: VW
    (2, "Color"): 0.99,  # Red: VC
    (4, "Brand"): 0.97,  # Kiddo: VC
    (4, "Color"): None,  # Green, unannotated (strict: NV); no confidence: never dropped
}


def add_confidence(base: Path) -> None:
    """The files write_predictions wrote, again with a confidence column."""
    for path in base.glob("attributes/*/*.parquet"):
        table = pq.read_table(path)
        ids = table["product_id"].to_pylist()
        values = [CONFIDENCE.get((int(pid.rsplit("-", 1)[1]), name)) if pid.startswith("tiny-test-") else 0.1
                  for pid, name in zip(ids, table["attribute"].to_pylist())]  # fmt: skip
        pq.write_table(table.append_column(pa.field("confidence", pa.float32()), pa.array(values, pa.float32())), path)


def test_scores_by_confidence_counted_by_hand(tmp_path: Path, gold_dir: Path, capsys):
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    argv = ["evaluate", "--predictions", str(out), "--gold", str(gold_dir / "gold.jsonl"), "--attributes",
            str(gold_dir / "attributes.json")]  # fmt: skip
    assert main(argv) == 0
    assert "by_confidence" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # no column: no table
    assert "By confidence" not in (out / "_evaluation.md").read_text(encoding="utf-8")
    add_confidence(out)
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["micro"] == {"precision": 57.14, "recall": 57.14, "f1": 57.14}  # the headline is unchanged
    rows = {row["threshold"]: row for row in summary["by_confidence"]}
    assert rows[0.0]["micro"] == summary["micro"] and rows[0.0]["values"] == 8 and rows[0.0]["share"] == 100.0
    # 0.5: Soft (NV -> NN) and zed (VW -> VN) dropped: VC 4, VW 1, VN 2 (zed, the unpredicted Sock)
    assert rows[0.5]["values"] == 6 and rows[0.5]["share"] == 75.0
    assert rows[0.5]["micro"] == {"precision": 80.0, "recall": 57.14, "f1": 66.66}  # F1 of the rounded P and R
    # 0.9: Navy (VC -> VN) and Gray (VW -> VN) too: VC 3 (Acme, Red, Kiddo), VN 4; Green kept (strict NV)
    assert rows[0.9]["values"] == 4 and rows[0.9]["share"] == 50.0
    assert rows[0.9]["micro"] == {"precision": 100.0, "recall": 42.86, "f1": 60.0}
    assert rows[0.9]["strict"] == {"precision": 75.0, "recall": 42.86, "f1": 54.55}
    # 0.95: Acme's 0.95, stored as the float32 0.949999988, is at least 0.95 as the column stores it
    assert rows[0.95]["values"] == 4 and rows[0.95]["micro"] == rows[0.9]["micro"]
    assert rows[0.99]["values"] == 2  # Red (0.99) and Green (no confidence)
    markdown = (out / "_evaluation.md").read_text(encoding="utf-8")
    assert "| 0.9 | 4 | 50.00% | 100.00 | 42.86 | 60.00 | 75.00 | 54.55 |" in markdown


def test_reading_and_dropping(tmp_path: Path, gold_dir: Path):
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    add_confidence(out)
    predictions = read_predictions(str(out))
    assert predictions.confidence["tiny-test-00000"] == {"Brand": pytest.approx(0.95), "Color": pytest.approx(0.6)}
    assert "Color" not in predictions.confidence["tiny-test-00004"]  # null: not known, not 0
    at = kept(predictions.values, predictions.confidence, 0.9)
    assert at["tiny-test-00000"] == {"Brand": "Acme", "Color": None} and at["tiny-test-00004"]["Color"] == "Green"
    assert by_confidence(read_gold(str(gold_dir / "gold.jsonl")), predictions.values, {}) == []
    nan = {"tiny-test-00000": {"Brand": float("nan")}}
    assert kept(predictions.values, nan, 0.5)["tiny-test-00000"]["Brand"] is None  # not a number: not sure
    assert kept(predictions.values, nan, 0.0)["tiny-test-00000"]["Brand"] == "Acme"  # 0: every value
    gold = read_gold(str(gold_dir / "gold.jsonl"))
    (only,) = by_confidence(gold, predictions.values, predictions.confidence, thresholds=(0.9,))
    assert only.values == 4 and only.share == 50.0  # the share of all values, with no 0 asked for


def test_show_values_prints_the_first_products_with_their_confidences(tmp_path: Path, gold_dir: Path, capsys):
    """scripts/show_values.py (the quickstart's last lines): titles from the input, values and
    confidences from the output, reading no more files than it needs; a clear line, exit 1, for a
    folder without values."""
    show = load_script("show_values")
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    add_confidence(out)
    records = gold_dir / "records.jsonl"
    read = []

    def counted(fragment, optional=()):
        read.append(fragment)
        return read_columns(fragment, optional)

    show.read_columns = counted
    assert show.main([str(out), "--input", str(records), "--products", "1"]) == 0
    assert len(read) == 1  # one file of three held the product
    text = capsys.readouterr().out
    first = text.splitlines()[1]
    assert text.startswith(f"1 product of {out}/attributes/:") and len(text.splitlines()) == 4  # a product, 2 values
    shown = {"tiny-test-00000": "Acme Towel Navy", "tiny-test-00002": "Zed Runner Red", "tiny-test-00004": "Kiddo Shoe Green",
             "tiny-test-00001": "Soft Bath Mat", "ghost-1": "(not in"}  # fmt: skip
    assert any(first.startswith(f"  {title}") and pid in first for pid, title in shown.items()), first
    if "tiny-test-00000" in first:
        assert "    Brand: Acme   (confidence 0.95)" in text
    assert show.main([str(out), "--input", str(records), "--products", "9"]) == 0
    text = capsys.readouterr().out
    assert "  Acme Towel Navy  (Home & Kitchen/Bath, tiny-test-00000)\n    Brand: Acme   (confidence 0.95)\n    Color: Navy   (confidence 0.60)" in text
    assert "  Kiddo Shoe Green  (Shoes, tiny-test-00004)" in text and "    Color: Green\n" in text  # no confidence: none shown
    assert "(not in " in text  # ghost-1: an output product the input does not hold
    empty = tmp_path / "empty"
    (empty / "attributes" / "category=x").mkdir(parents=True)
    assert show.main([str(empty), "--input", str(records)]) == 1
    assert "show_values: no Parquet files under" in capsys.readouterr().err

    # any input the job reads (it used to read a local JSON Lines file only: helper-46, session 55),
    # by default the one its _job.json names
    import gzip

    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "part-0.jsonl.gz").write_bytes(gzip.compress(records.read_bytes()))
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in ("product_id", "category", "title")} for r in rows]),
                   tmp_path / "records.parquet")
    expected = "  Acme Towel Navy  (Home & Kitchen/Bath, tiny-test-00000)"
    for given in (inputs, tmp_path / "records.parquet"):
        assert show.main([str(out), "--input", str(given), "--products", "9"]) == 0
        assert expected in capsys.readouterr().out
    assert show.main([str(out)]) == 1
    assert "has no _job.json to name its input: pass --input" in capsys.readouterr().err
    (out / "_job.json").write_text(json.dumps({"run_id": "r", "arguments": {"input": str(inputs)}}))
    assert show.main([str(out), "--products", "9"]) == 0
    assert expected in capsys.readouterr().out
