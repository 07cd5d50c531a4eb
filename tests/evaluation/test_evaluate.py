"""`hpd evaluate`: hive-partitioned Parquet predictions (local and S3) joined to gold."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

from datafiles.dataset import read_attributes, read_gold
from datafiles.predictions import attribute_paths, read_predictions, read_values, rows_by_category
from datafiles.storage import s3_options
from jobs.cli import main

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
OA_MINE_TEST = SHARED / "data" / "oa-mine" / "test.jsonl"
OA_MINE_RUN = SHARED / "data" / "extractgpt-runs" / "gpt_3.5-turbo-0613" / "list-oa-mine-10-shots_2023-10-08_12-31-04.gz"

BATH = "Home & Kitchen/Bath"
GOLD = [
    {"input": "Acme Towel Navy", "category": BATH, "target_scores": {"Brand": {"Acme": 1}, "Color": {"Blue": 1, "Navy": 1}}},
    {"input": "Soft Bath Mat", "category": BATH, "target_scores": {"Brand": {"n/a": 1}, "Color": {"Grey": 1}}},
    {"input": "Zed Runner Red", "category": "Shoes", "target_scores": {"Brand": {"Zed": 1}, "Color": {"Red": 1}}},
    {"input": "Plain Sock", "category": "Shoes", "target_scores": {"Brand": {"Sox": 1}}},  # never predicted
    {"input": "Kiddo Shoe Green", "category": "Shoes", "target_scores": {"Brand": {"Kiddo": 1}}},
]
# product index -> {attribute: value}
PREDICTED = {
    0: {"Brand": "Acme", "Color": "Navy"},  # VC VC
    1: {"Brand": "Soft", "Color": "Gray"},  # NV VW
    2: {"Brand": "zed", "Color": "Red"},  # VW VC
    4: {"Brand": "Kiddo", "Color": "Green"},  # VC, unannotated Color (strict: NV)
}


def _pid(i: int) -> str:
    return f"tiny-test-{i:05d}"


def _rows(category: str, items: dict[int, dict[str, object]]) -> dict[str, list]:
    rows: dict[str, list] = {k: [] for k in ("product_id", "category", "attribute", "value", "truncated", "decoder", "model", "run_id")}
    for i, values in items.items():
        for attribute, value in values.items():
            rows["product_id"].append(_pid(i) if isinstance(i, int) else i)
            rows["category"].append(category)
            rows["attribute"].append(attribute)
            rows["value"].append(value)
            rows["truncated"].append(attribute == "Color" and i == 4)
            rows["decoder"].append("hpd")
            rows["model"].append("tiny")
            rows["run_id"].append("run-1")
    return rows


SCHEMA = pa.schema(
    [("product_id", pa.string()), ("category", pa.string()), ("attribute", pa.string()), ("value", pa.string()),
     ("truncated", pa.bool_()), ("decoder", pa.string()), ("model", pa.string()), ("run_id", pa.string())]
)


def write_predictions(filesystem: fs.FileSystem, base: str) -> None:
    """Hive layout like the extraction job: the Bath directory name is escaped, the file keeps the
    real category; the Shoes file has no category column (the directory value stands in)."""
    bath_dir = f"{base}/attributes/category={quote(BATH, safe='')}"
    shoes_dir = f"{base}/attributes/category=Shoes"
    for directory in (bath_dir, shoes_dir):
        filesystem.create_dir(directory, recursive=True)
    bath = pa.Table.from_pydict(_rows(BATH, {i: PREDICTED[i] for i in (0, 1)}), schema=SCHEMA)
    shoes = pa.Table.from_pydict(_rows("Shoes", {i: PREDICTED[i] for i in (2, 4)}), schema=SCHEMA).drop_columns(["category"])
    extra = pa.Table.from_pydict(_rows("Shoes", {"ghost-1": {"Brand": "Boo"}}), schema=SCHEMA)
    pq.write_table(bath, f"{bath_dir}/part-0.parquet", filesystem=filesystem)
    pq.write_table(shoes, f"{shoes_dir}/part-0.parquet", filesystem=filesystem)
    pq.write_table(extra, f"{shoes_dir}/part-1.parquet", filesystem=filesystem)


@pytest.fixture
def gold_dir(tmp_path: Path) -> Path:
    source = tmp_path / "tiny" / "test.jsonl"
    source.parent.mkdir()
    source.write_text("".join(json.dumps(row) + "\n" for row in GOLD), encoding="utf-8")
    assert main(["convert", "extractgpt", str(source), "--out", str(tmp_path / "converted")]) == 0
    return tmp_path / "converted"


EXPECTED_MICRO = {"precision": 57.14, "recall": 57.14, "f1": 57.14}  # VC 4 / 7 both ways (NV 1, VW 2, VN 1)
EXPECTED_STRICT_MICRO = {"precision": 50.0, "recall": 57.14, "f1": 53.33}  # + NV 1 (Kiddo Color)


def _check_summary(summary: dict) -> None:
    assert summary["micro"] == EXPECTED_MICRO
    assert summary["counts"] == {"nn": 0, "nv": 1, "vn": 1, "vc": 4, "vw": 2}
    # Bath/Brand 50/100/66.67, Bath/Color 50/50/50, Shoes/Brand 50/33.33/40 (Sock missing: VN),
    # Shoes/Color 100/100/100
    assert summary["macro"] == {"precision": 62.5, "recall": 70.83, "f1": 64.17}
    assert summary["strict"]["micro"] == EXPECTED_STRICT_MICRO
    assert summary["strict"]["counts"] == {"nn": 1, "nv": 2, "vn": 1, "vc": 4, "vw": 2}
    assert summary["products"] == {
        "gold": 5, "predicted": 4, "missing": 1, "extra": 1, "category_mismatch": 0, "rows": 9, "truncated": 1,
    }


def test_evaluate_local_end_to_end(tmp_path: Path, gold_dir: Path, capsys):
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    code = main(["evaluate", "--predictions", str(out), "--gold", str(gold_dir / "gold.jsonl"), "--attributes", str(gold_dir / "attributes.json")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    _check_summary(summary)
    report = json.loads((out / "_evaluation.json").read_text(encoding="utf-8"))
    assert report["micro"] == EXPECTED_MICRO
    assert {(r["category"], r["attribute"]) for r in report["tables"]["extractgpt"]} == {
        (BATH, "Brand"), (BATH, "Color"), ("Shoes", "Brand"), ("Shoes", "Color")
    }
    markdown = (out / "_evaluation.md").read_text(encoding="utf-8")
    assert "| Home & Kitchen/Bath | Brand | 0 | 1 | 0 | 1 | 0 | 50.00 | 100.00 | 66.67 |" in markdown
    assert "| Shoes | Color | 0 | 0 | 0 | 1 | 0 | 100.00 | 100.00 | 100.00 | 1 | 1 | 50.00 | 66.67 |" in markdown


def test_a_product_predicted_under_another_category_is_said(tmp_path: Path, gold_dir: Path, capsys):
    """Records and gold from different conversions can share ids: the category tells them apart."""
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    assert main(["evaluate", "--predictions", str(out), "--gold", str(gold_dir / "gold.jsonl"), "--no-write"]) == 0
    assert "another category" not in capsys.readouterr().err
    gold = [json.loads(line) for line in (gold_dir / "gold.jsonl").read_text().splitlines()]
    gold[2]["category"] = BATH  # predicted as Shoes
    moved = tmp_path / "moved.jsonl"
    moved.write_text("".join(json.dumps(g) + "\n" for g in gold))
    assert main(["evaluate", "--predictions", str(out), "--gold", str(moved), "--no-write"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["products"]["category_mismatch"] == 1
    assert (f"hpd evaluate: warning: 1 product(s) have another category in the predictions than in the gold "
            f"(e.g. 'tiny-test-00002': 'Shoes' predicted, {BATH!r} in the gold)") in captured.err


def test_gold_products_without_predictions_are_said_and_can_be_left_out(tmp_path: Path, gold_dir: Path, capsys):
    """Scoring a job on part of the input (the quickstart's 40 of 491 products) against the whole
    gold counts every other product as misses: said on stderr; --predicted-only scores the rest."""
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    argv = ["evaluate", "--predictions", str(out), "--gold", str(gold_dir / "gold.jsonl"), "--no-write"]
    assert main(argv) == 0
    assert "warning: 1 of 5 gold products have no predictions" in capsys.readouterr().err
    assert main(argv + ["--predicted-only"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert "warning" not in captured.err
    assert (summary["products"]["gold"], summary["products"]["missing"], summary["counts"]["vn"]) == (4, 0, 0)


def test_category_column_wins_over_partition_directory(tmp_path: Path):
    directory = tmp_path / "o" / "attributes" / "category=Home_Kitchen_Bath"  # lossy path-safe name
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pydict(_rows(BATH, {0: PREDICTED[0]}), schema=SCHEMA), directory / "x.parquet")
    predictions = read_predictions(str(tmp_path / "o"))
    assert predictions.categories == {_pid(0): BATH}
    assert predictions.values == {_pid(0): {"Brand": "Acme", "Color": "Navy"}}


def test_reader_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="hpd extract"):
        read_predictions(str(tmp_path / "nothing-here"))
    (tmp_path / "empty" / "attributes").mkdir(parents=True)
    with pytest.raises(ValueError, match="no Parquet files"):
        read_predictions(str(tmp_path / "empty"))
    bad = tmp_path / "bad" / "attributes"
    bad.mkdir(parents=True)
    pq.write_table(pa.table({"product_id": ["p"], "value": ["v"]}), bad / "x.parquet")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['attribute'\]"):
        read_predictions(str(tmp_path / "bad"))
    dup = tmp_path / "dup" / "attributes"
    dup.mkdir(parents=True)
    table = pa.Table.from_pydict(_rows("Shoes", {2: {"Brand": "Zed"}}), schema=SCHEMA)
    pq.write_table(table, dup / "a.parquet")
    pq.write_table(table, dup / "b.parquet")
    with pytest.raises(ValueError, match="duplicate prediction"):
        read_predictions(str(tmp_path / "dup"))
    with pytest.raises(ValueError, match="unsupported URI scheme"):
        read_predictions("gs://bucket/x")


def test_gold_and_attribute_file_errors(tmp_path: Path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"product_id": "a", "category": "c", "target_scores": {}}\n' * 2, encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: duplicate product_id 'a'"):
        read_gold(str(gold))
    gold.write_text('{"product_id": "a", "category": "c", "target_scores": {"B": []}}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: target_scores"):
        read_gold(str(gold))
    attributes = tmp_path / "attributes.json"
    attributes.write_text(json.dumps({"c": ["Brand", "Color"], "d": {"Size": "EU"}}))
    assert read_attributes(str(attributes)) == {"c": ["Brand", "Color"], "d": ["Size"]}
    yaml_schema = tmp_path / "attributes.yaml"
    yaml_schema.write_text("c:\n  - Brand\n  - Color\nd:\n  Size: EU size\n")
    assert read_attributes(str(yaml_schema)) == {"c": ["Brand", "Color"], "d": ["Size"]}
    attributes.write_text(json.dumps({"c": [1]}))
    with pytest.raises(ValueError, match="category 'c': attribute name must be a non-empty string"):
        read_attributes(str(attributes))


def _cli_error(argv: list[str], capsys, monkeypatch) -> str:
    """Run `hpd` expecting a user error: exit status 2, one short message, no traceback."""
    monkeypatch.delenv("HPD_TRACEBACK", raising=False)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("hpd evaluate: error: ") and captured.err.count("\n") == 1
    return captured.err


def test_predictions_with_no_gold_id_are_an_error_not_a_zero_score(tmp_path: Path, gold_dir: Path, capsys, monkeypatch):
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    gold = tmp_path / "other-gold.jsonl"  # the same products under other ids (another conversion)
    rows = [json.loads(line) for line in (gold_dir / "gold.jsonl").read_text().splitlines()]
    gold.write_text("".join(json.dumps(dict(r, product_id=r["product_id"].replace("tiny-test-", "tiny-test-1"))) + "\n"
                            for r in rows))
    message = _cli_error(["evaluate", "--predictions", str(out), "--gold", str(gold)], capsys, monkeypatch)
    assert "none of the 5 product ids" in message and "is among the 5 gold ids" in message
    assert "'ghost-1' vs 'tiny-test-100000'" in message
    assert not (out / "_evaluation.json").exists()


def test_cli_user_errors_are_short(tmp_path: Path, gold_dir: Path, capsys, monkeypatch):
    gold = str(gold_dir / "gold.jsonl")
    assert "pass --predictions URI and --gold FILE" in _cli_error(["evaluate", "--gold", gold], capsys, monkeypatch)
    out = tmp_path / "job-output"
    assert "pass --predictions URI and --gold FILE" in _cli_error(["evaluate", "--predictions", str(out)], capsys, monkeypatch)
    missing_gold = str(tmp_path / "missing" / "gold.jsonl")
    message = _cli_error(["evaluate", "--predictions", str(out), "--gold", missing_gold], capsys, monkeypatch)
    assert f"file not found: {missing_gold}" in message
    message = _cli_error(["evaluate", "--predictions", str(out), "--gold", gold], capsys, monkeypatch)
    assert f"{out} does not exist: pass the output directory of `hpd extract`" in message
    out.mkdir()
    message = _cli_error(["evaluate", "--predictions", str(out), "--gold", gold], capsys, monkeypatch)
    assert f"no predictions at {out}/attributes/" in message and "hpd extract" in message
    (out / "_job.json").write_text("{}")  # a job that wrote no values (every row rejected, or none)
    message = _cli_error(["evaluate", "--predictions", str(out), "--gold", gold], capsys, monkeypatch)
    assert f"the job in {out} wrote no values (no Parquet files under attributes/)" in message
    (out / "_job.json").unlink()
    (out / "attributes").mkdir(parents=True)
    message = _cli_error(["evaluate", "--predictions", str(out), "--gold", gold], capsys, monkeypatch)
    assert f"no Parquet files under {out}/attributes/" in message
    message = _cli_error(["evaluate", "--predictions", gold, "--gold", gold], capsys, monkeypatch)  # a file, not a directory
    assert "attributes" in message
    write_predictions(fs.LocalFileSystem(), str(out))
    missing_schema = str(tmp_path / "attributes.json")
    message = _cli_error(["evaluate", "--predictions", str(out), "--gold", gold, "--attributes", missing_schema], capsys, monkeypatch)
    assert f"file not found: {missing_schema}" in message
    assert not (out / "_evaluation.json").exists()


def test_real_oa_mine_via_parquet_matches_stored_run(tmp_path: Path, capsys):
    """Converted OA-Mine gold + a stored GPT-3.5 run written as job output = the stored scores."""
    converted = tmp_path / "oa"
    assert main(["convert", "extractgpt", str(OA_MINE_TEST), "--out", str(converted)]) == 0
    run = json.loads(gzip.decompress(OA_MINE_RUN.read_bytes()))
    gold = [json.loads(line) for line in (converted / "gold.jsonl").read_text(encoding="utf-8").splitlines()]
    rows: dict[str, list] = {"product_id": [], "category": [], "attribute": [], "value": []}
    for g, example in zip(gold, run["examples"], strict=True):
        for attribute, value in json.loads(example["pred"]).items():
            rows["product_id"].append(g["product_id"])
            rows["category"].append(g["category"])
            rows["attribute"].append(attribute)
            rows["value"].append(value)
    out = tmp_path / "job"
    pq.write_to_dataset(pa.table(rows), str(out / "attributes"), partition_cols=["category"])  # drops the column
    capsys.readouterr()
    assert main(["evaluate", "--predictions", str(out), "--gold", str(converted / "gold.jsonl"), "--no-write"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {f"micro_{k}": v for k, v in summary["micro"].items()} == run["results"]["micro"]
    assert {f"macro_{k}": v for k, v in summary["macro"].items()} == run["results"]["macro"]
    assert summary["products"]["missing"] == 0 and summary["products"]["category_mismatch"] == 0
    assert not (out / "_evaluation.md").exists()


def test_extractgpt_run_mode_prints_match(capsys):
    assert main(["evaluate", "--extractgpt-run", str(OA_MINE_RUN)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["matches_stored"] == {"micro": True, "macro": True, "combos": True}
    assert result["micro"] == {"precision": 78.86, "recall": 69.73, "f1": 74.01}


def test_extractgpt_run_mode_detects_a_mismatch(tmp_path: Path, capsys):
    run = json.loads(gzip.decompress(OA_MINE_RUN.read_bytes()))
    run["results"]["micro"]["micro_f1"] = 99.99
    tampered = tmp_path / "run.gz"
    tampered.write_bytes(gzip.compress(json.dumps(run).encode()))
    assert main(["evaluate", "--extractgpt-run", str(tampered)]) == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["matches_stored"]["micro"] is False and result["matches_stored"]["macro"] is True


# --- a real local S3 server (SeaweedFS) --------------------------------------------------------


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh bucket on the shared S3 server (tests/conftest.py) and a pyarrow file system for it."""
    return s3_server.make_bucket("evaluate"), fs.S3FileSystem(**s3_options(s3_server.env))


def test_evaluate_s3_end_to_end(s3_bucket, gold_dir: Path, capsys):
    bucket, filesystem = s3_bucket
    write_predictions(filesystem, f"{bucket}/jobs/run-1")
    code = main(["evaluate", "--predictions", f"s3://{bucket}/jobs/run-1/", "--gold", str(gold_dir / "gold.jsonl"), "--attributes", str(gold_dir / "attributes.json")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    _check_summary(summary)
    assert summary["report_md"] == f"s3://{bucket}/jobs/run-1/_evaluation.md"
    with filesystem.open_input_stream(f"{bucket}/jobs/run-1/_evaluation.md") as stream:
        assert "| Home & Kitchen/Bath | Color |" in stream.read().decode("utf-8")
    with filesystem.open_input_stream(f"{bucket}/jobs/run-1/_evaluation.json") as stream:
        assert json.loads(stream.read())["strict"]["micro"] == EXPECTED_STRICT_MICRO


def test_evaluate_s3_user_errors(s3_bucket, gold_dir: Path, capsys, monkeypatch):
    bucket, _ = s3_bucket
    gold = str(gold_dir / "gold.jsonl")
    message = _cli_error(["evaluate", "--predictions", f"s3://{bucket}/jobs/none", "--gold", gold], capsys, monkeypatch)
    assert f"s3://{bucket}/jobs/none does not exist: pass the output directory of `hpd extract`" in message
    message = _cli_error(["evaluate", "--predictions", f"s3://{bucket}/jobs/none", "--gold", f"s3://{bucket}/missing.jsonl"], capsys, monkeypatch)
    assert f"file not found: s3://{bucket}/missing.jsonl" in message


def test_gold_attributes_the_schema_lacks_are_warned_of_with_counts(tmp_path: Path, gold_dir: Path, capsys):
    """Gold naming `brand` where the schema says `Brand` scores every such value as a miss: warned of
    (products, attributes, the first line, the name in the schema's case); the score is still given."""
    out = tmp_path / "job-output"
    write_predictions(fs.LocalFileSystem(), str(out))
    argv = ["evaluate", "--predictions", str(out), "--no-write"]
    assert main(argv + ["--gold", str(gold_dir / "gold.jsonl"), "--attributes", str(gold_dir / "attributes.json")]) == 0
    assert "does not have" not in capsys.readouterr().err
    gold = [json.loads(line) for line in (gold_dir / "gold.jsonl").read_text().splitlines()]
    for row in gold[2:]:  # the Shoes lines
        row["target_scores"] = {name.lower() if name == "Brand" else name: v for name, v in row["target_scores"].items()}
    lower = tmp_path / "lower.jsonl"
    lower.write_text("".join(json.dumps(g) + "\n" for g in gold))
    assert main(argv + ["--gold", str(lower), "--attributes", str(gold_dir / "attributes.json")]) == 0
    err = capsys.readouterr().err
    assert (f"warning: 3 of 5 gold products name 3 attribute(s) that the schema {gold_dir / 'attributes.json'} does not "
            f"have for their category (e.g. {lower} line 3, category 'Shoes': brand (Brand?); it has Brand, Color)") in err
    assert main(argv + ["--gold", str(lower)]) == 0  # no schema: the predictions' attributes of the category
    assert f"3 of 5 gold products name 3 attribute(s) that the predictions in {out} does not have" in capsys.readouterr().err


def _streamed(uri: str) -> tuple[list[str], dict, dict]:
    """What the readers for an output of any size give: its files, product -> category, and the values."""
    filesystem, paths = attribute_paths(uri)
    paths = list(paths)
    categories: dict = {}
    for path in paths:
        for category, table in rows_by_category(filesystem, path, ("product_id", "attribute")).items():
            for product_id in table["product_id"].to_pylist():
                categories.setdefault(product_id, category)
    return paths, categories, read_values(filesystem, paths, set(categories))


def _hand_made_and_hidden_files(base: Path) -> None:
    """A file of no category (no category= folder, no column), and files the dataset discovery passes over."""
    loose = pa.Table.from_pydict(_rows("x", {"loose-1": {"Brand": "Lo"}}), schema=SCHEMA).drop_columns(["category"])
    pq.write_table(loose, base / "attributes" / "loose.parquet")
    (base / "attributes" / "_temporary" / "category=Shoes").mkdir(parents=True)
    hidden = pa.Table.from_pydict(_rows("Shoes", {"hidden-1": {"Brand": "No"}}), schema=SCHEMA).drop_columns(["category"])
    pq.write_table(hidden, base / "attributes" / "_temporary" / "category=Shoes" / "x.parquet")
    pq.write_table(hidden, base / "attributes" / "category=Shoes" / ".x.parquet")


def test_the_readers_for_any_size_agree_with_read_predictions(tmp_path: Path):
    """attribute_paths, rows_by_category and read_values (what `hpd pick` reads an output of any
    size with) give what read_predictions (the whole output in memory) gives: the same files, each
    product's category (the directory's, the column's, or none) and values."""
    write_predictions(fs.LocalFileSystem(), str(tmp_path / "o"))
    _hand_made_and_hidden_files(tmp_path / "o")
    predictions = read_predictions(str(tmp_path / "o"))
    paths, categories, values = _streamed(str(tmp_path / "o"))
    assert len(paths) == predictions.files == 4
    assert categories == predictions.categories and categories["loose-1"] is None and categories[_pid(0)] == BATH
    assert values == predictions.values
    filesystem, _ = attribute_paths(str(tmp_path / "o"))
    assert read_values(filesystem, paths, {_pid(2)}) == {_pid(2): PREDICTED[2]}  # only those asked for


def test_the_readers_for_any_size_read_s3(s3_bucket):
    bucket, filesystem = s3_bucket
    write_predictions(filesystem, f"{bucket}/jobs/run-2")
    predictions = read_predictions(f"s3://{bucket}/jobs/run-2")
    paths, categories, values = _streamed(f"s3://{bucket}/jobs/run-2/")
    assert len(paths) == 3 and (categories, values) == (predictions.categories, predictions.values)


def test_the_readers_for_any_size_say_what_is_wrong(tmp_path: Path):
    with pytest.raises(ValueError, match="hpd extract"):
        attribute_paths(str(tmp_path / "nothing-here"))
    (tmp_path / "empty" / "attributes").mkdir(parents=True)
    with pytest.raises(ValueError, match="no Parquet files"):
        list(attribute_paths(str(tmp_path / "empty"))[1])
    bad = tmp_path / "bad" / "attributes"
    bad.mkdir(parents=True)
    pq.write_table(pa.table({"product_id": ["p"], "value": ["v"]}), bad / "x.parquet")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['attribute'\]"):
        rows_by_category(fs.LocalFileSystem(), str(bad / "x.parquet"), ("product_id",))
    dup = tmp_path / "dup" / "attributes"
    dup.mkdir(parents=True)
    table = pa.Table.from_pydict(_rows("Shoes", {2: {"Brand": "Zed"}}), schema=SCHEMA)
    pq.write_table(table, dup / "a.parquet")
    pq.write_table(table, dup / "b.parquet")
    with pytest.raises(ValueError, match="duplicate prediction"):
        read_values(fs.LocalFileSystem(), [str(dup / "a.parquet"), str(dup / "b.parquet")], {_pid(2)})
    with pytest.raises(ValueError, match="unsupported URI scheme"):
        attribute_paths("gs://bucket/x")
