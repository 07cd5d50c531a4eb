"""`hpd evaluate` on an output of any size: it holds the values of the gold's products (and of the
records', for the leakage figure) alone (``read_predictions(uri, only=...)``), and scores, warns,
refuses and reports exactly as the whole output folded into memory (``read_predictions(uri)``, the
slow reference) does."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

import jobs.evaluate
from datafiles.predictions import read_predictions
from jobs.cli import main
from pipelines.commit import CONFIDENCE_FIELD, PARTITION_COLUMN, attributes_schema
from pipelines.schema import partition_value

from .test_confidence import add_confidence
from .test_evaluate import BATH, SCHEMA, _hand_made_and_hidden_files, _rows, write_predictions

ATTRIBUTES = ("Brand", "Color", "Size")
WORDS = ("Acme", "Zed", "Kiddo", "red", "blue", "navy", "wool", "cotton", "large", "small", "12 oz", "Sox")


def write_output(base: Path, products: int, categories: int, chunk_rows: int, seed: int = 0,
                 confidence: bool = False) -> list[dict]:
    """What `hpd extract` writes (pipelines/commit.py): ``attributes/category=<c>/<chunk>.parquet``
    without the category column, a file per chunk of input rows and category, every product's rows
    in one file; some products with no row (the job dropped them). Returns the input records."""
    rng = random.Random(seed)
    schema = attributes_schema(confidence)
    schema = schema.remove(schema.get_field_index(PARTITION_COLUMN))
    records = []
    for chunk, start in enumerate(range(0, products, chunk_rows)):
        by_category: dict[str, list[tuple[str, dict]]] = {}
        for row in range(start, min(start + chunk_rows, products)):
            category = f"Category {row % categories}" if categories > 1 else "Category 0"
            title = " ".join(rng.sample(WORDS, 4))
            records.append({"product_id": f"p{row:07d}", "category": category, "title": title})
            if rng.random() < 0.05:
                continue  # rejected by the job: no rows
            values = {name: rng.choice([*WORDS, None]) for name in ATTRIBUTES}
            by_category.setdefault(category, []).append((f"p{row:07d}", values))
        for category, items in by_category.items():
            n = len(items) * len(ATTRIBUTES)
            columns = {
                "product_id": [pid for pid, _ in items for _ in ATTRIBUTES],
                "attribute": list(ATTRIBUTES) * len(items),
                "value": [values[name] for _, values in items for name in ATTRIBUTES],
                "truncated": [rng.random() < 0.1 for _ in range(n)],
                "decoder": ["hpd"] * n, "model": ["tiny"] * n, "run_id": ["r"] * n,
            }
            if confidence:
                columns[CONFIDENCE_FIELD.name] = [None if rng.random() < 0.2 else rng.random() for _ in range(n)]
            folder = base / "attributes" / f"{PARTITION_COLUMN}={partition_value(category)}"
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table(columns, schema=schema), folder / f"{chunk:06d}.parquet")
    return records


def write_gold(path: Path, records: list[dict], count: int, seed: int) -> None:
    """Gold for ``count`` of the records (some never predicted), a lowercase name on one, another
    category on one, and a product of no record at all."""
    rng = random.Random(seed)
    lines = []
    for i, record in enumerate(rng.sample(records, count)):
        scores = {name: {rng.choice(WORDS): 1} if rng.random() < 0.8 else {"n/a": 1} for name in ATTRIBUTES[:2]}
        if i == 0:
            scores["brand"] = {"Acme": 1}
        lines.append({"product_id": record["product_id"], "category": "Elsewhere" if i == 1 else record["category"],
                      "target_scores": scores})
    lines.append({"product_id": "nowhere-1", "category": "Category 0", "target_scores": {"Brand": {"Acme": 1}}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def _restricted(whole, only) -> dict:
    """The reference's fields with its per-product ones kept for ``only``."""
    return {"values": {p: v for p, v in whole.values.items() if p in only},
            "categories": {p: c for p, c in whole.categories.items() if p in only},
            "confidence": {p: c for p, c in whole.confidence.items() if p in only},
            "truncated_products": {p for p in whole.truncated_products if p in only},
            "counts": (whole.rows, whole.files, whole.truncated, whole.products, whole.least_id), "attributes": whole.attributes}


def _fields(some) -> dict:
    return {"values": some.values, "categories": some.categories, "confidence": some.confidence,
            "truncated_products": some.truncated_products, "counts": (some.rows, some.files, some.truncated, some.products, some.least_id), "attributes": some.attributes}


def test_reading_some_products_agrees_with_the_whole_fold(tmp_path: Path):
    """The values, categories, confidences and truncation of the products asked for, and the whole output's
    rows, files, truncated rows, products, least id and attribute names per category: on the
    hand-written output (a category column, an escaped folder, a file of no category, hidden files)
    and on a generated one in the job's layout."""
    write_predictions(fs.LocalFileSystem(), str(tmp_path / "o"))
    _hand_made_and_hidden_files(tmp_path / "o")
    lossy = tmp_path / "o" / "attributes" / "category=Home_Kitchen_Bath"  # a path-safe name; the column's wins
    lossy.mkdir()
    pq.write_table(pa.Table.from_pydict(_rows(BATH, {"lossy-1": {"Size": "M"}}), schema=SCHEMA), lossy / "x.parquet")
    add_confidence(tmp_path / "o")
    write_output(tmp_path / "g", products=300, categories=4, chunk_rows=64, confidence=True)
    for uri, ids in ((tmp_path / "o", ["tiny-test-00000", "tiny-test-00004", "loose-1", "ghost-1", "hidden-1", "lossy-1"]),
                     (tmp_path / "g", [f"p{i:07d}" for i in range(0, 300, 7)])):
        whole = read_predictions(str(uri))
        assert uri.name == "g" or (whole.categories["lossy-1"] == BATH and "Size" in whole.attributes[BATH])
        assert whole.products == len(whole.values) > 4 and whole.truncated > 0 and whole.confidence
        assert whole.truncated_products and whole.truncated_products <= set(whole.values)
        many = set(whole.values) | {f"absent-{i}" for i in range(5000)}  # far more ids than a file's rows: looked up
        for only in (set(), set(ids[:1]), set(ids), set(whole.values), {"not-there"}, many):
            assert _fields(read_predictions(str(uri), only=only)) == _restricted(whole, only), (uri, len(only))


def test_reading_some_products_takes_ids_of_any_text_type_and_of_mixed_types(tmp_path: Path):
    """Ids written dictionary-encoded (pandas' categorical column), as view strings, or an all-null
    empty file crashed the read of some products (Arrow's count_distinct takes none of them), and
    string and integer ids in one output crashed both reads (the least id); a product split over
    "category=a/" and "category=a-b/" (hand-made) takes the category of the file first in full-path
    order in both (helper-41's review)."""
    base = tmp_path / "o" / "attributes"
    for name, ids in (("dict", pa.array(["d1", "d2", "d1"]).dictionary_encode()),
                      ("view", pa.array(["v1", "v2", "v2"], pa.string_view())),
                      ("ints", pa.array([7, 8, 9], pa.int64()))):
        (base / f"category={name}").mkdir(parents=True)
        pq.write_table(pa.table({"product_id": ids, "attribute": ["A", "A", "B"], "value": ["x", "y", "z"]}),
                       base / f"category={name}" / "0.parquet")
    (base / "category=empty").mkdir()
    pq.write_table(pa.table({"product_id": pa.nulls(0), "attribute": pa.array([], pa.string()),
                             "value": pa.array([], pa.string())}), base / "category=empty" / "0.parquet")
    whole = read_predictions(str(tmp_path / "o"))
    assert whole.least_id == 7  # "int" sorts before "str"
    many = {"d1", "v2"} | {f"absent-{i}" for i in range(100)}  # more ids than a file's rows: looked up one by one
    for only in ({"d1", "v2"}, {"d2"}, set(), {p for p in whole.values if isinstance(p, str)}, many):  # gold ids are text
        assert _fields(read_predictions(str(tmp_path / "o"), only=only)) == _restricted(whole, only), only
    split = tmp_path / "split" / "attributes"
    for category in ("a", "a-b"):  # "s" split over two folders: its category is "a-b"'s, first in full-path order
        (split / f"category={category}").mkdir(parents=True)
        pq.write_table(pa.table({"product_id": ["s"], "attribute": [f"from {category}"], "value": ["v"]}),
                       split / f"category={category}" / "0.parquet")
    assert read_predictions(str(tmp_path / "split")).categories == {"s": "a-b"}
    assert read_predictions(str(tmp_path / "split"), only={"s"}).categories == {"s": "a-b"}


def test_reading_some_products_refuses_a_duplicate(tmp_path: Path):
    """A product given an attribute twice: refused in one file whichever the product, and across
    files for the products asked for (the message of the whole fold, naming the file)."""
    folder = tmp_path / "o" / "attributes" / "category=Shoes"
    folder.mkdir(parents=True)
    table = pa.table({"product_id": ["a", "b", "b"], "attribute": ["Brand", "Brand", "Brand"], "value": ["x", "y", "z"]})
    pq.write_table(table, folder / "0.parquet")
    message = r"0.parquet: duplicate prediction for product 'b', attribute 'Brand'"
    for only in (None, set(), {"a"}, {"b"}):
        with pytest.raises(ValueError, match=message):
            read_predictions(str(tmp_path / "o"), only=only)
    pq.write_table(table.slice(0, 2), folder / "0.parquet")
    pq.write_table(table.slice(0, 1), folder / "1.parquet")
    message = r"1.parquet: duplicate prediction for product 'a', attribute 'Brand'"
    for only in (None, {"a"}):
        with pytest.raises(ValueError, match=message):
            read_predictions(str(tmp_path / "o"), only=only)
    assert read_predictions(str(tmp_path / "o"), only={"b"}).products == 3  # counted once a file: see _read_some


def _evaluate(argv: list[str], capsys, out: Path | None = None) -> tuple:
    """Exit status, stdout, stderr, and the reports written into ``out`` (then removed)."""
    code = main(["evaluate", *argv])
    captured = capsys.readouterr()
    reports = {}
    for name in ("_evaluation.json", "_evaluation.md"):
        if out is not None and (out / name).exists():
            reports[name] = (out / name).read_text(encoding="utf-8")
            (out / name).unlink()
    return code, captured.out, captured.err, reports


@pytest.mark.parametrize("seed", [0, 1])
def test_evaluate_gives_what_the_whole_fold_gives(tmp_path: Path, capsys, monkeypatch, seed: int):
    """The summary line, the warnings, the errors and the written reports, with every option that
    reads the predictions: leakage (records beside the gold, neighbours of the gold's products
    that the gold leaves out), --predicted-only, no --attributes (the output's names), --compare."""
    out, other = tmp_path / "run", tmp_path / "other"
    records = write_output(out, products=400, categories=3, chunk_rows=50, seed=seed, confidence=True)
    write_output(other, products=400, categories=3, chunk_rows=128, seed=seed + 10)
    gold_dir = tmp_path / "labelled"
    gold_dir.mkdir()
    (gold_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (gold_dir / "attributes.json").write_text(json.dumps({f"Category {i}": list(ATTRIBUTES) for i in range(3)}))
    write_gold(gold_dir / "gold.jsonl", records, 40, seed)
    (tmp_path / "wrong.jsonl").write_text(json.dumps({"product_id": "q1", "category": "C", "target_scores": {}}) + "\n")
    base = ["--predictions", str(out), "--gold", str(gold_dir / "gold.jsonl"), "--docs-per-prompt", "3"]
    runs = [
        [*base, "--attributes", str(gold_dir / "attributes.json")],
        [*base, "--predicted-only", "--compare", str(other), "--draws", "50"],
        [*base, "--no-write", "--records", str(tmp_path / "none.jsonl")],  # an error
        ["--predictions", str(out), "--gold", str(tmp_path / "wrong.jsonl"), "--no-write"],  # an error
        [*base[:4], "--compare", str(other), "--draws", "50", "--no-write"],  # no J: no leakage
    ]
    new = [_evaluate(argv, capsys, out) for argv in runs]
    whole = lambda uri, only=None: read_predictions(uri)  # noqa: E731 (the reference: every product)
    monkeypatch.setattr(jobs.evaluate, "read_predictions", whole)
    assert new == [_evaluate(argv, capsys, out) for argv in runs]
    summary = json.loads(new[0][1].splitlines()[-1])
    assert summary["products"]["extra"] > 300 and summary["products"]["missing"] > 0
    assert summary["products"]["category_mismatch"] == 1 and summary["leakage"]["values"] > 1000  # every record's
    assert "does not have for their category" in new[0][2] and "by_confidence" in summary and new[0][3]
    assert "compare" in json.loads(new[1][1].splitlines()[-1]) and new[2][0] == new[3][0] == 2


def test_memory_is_that_of_the_gold_not_of_the_output(tmp_path: Path):
    """200,000 products in the job's layout scored against 50: the Python objects held at the peak
    (tracemalloc; pyarrow's buffers, a file's columns at a time, are not traced) are a small share
    of what the whole fold holds, and the values kept are the 50 products'."""
    write_output(tmp_path / "big", products=200_000, categories=10, chunk_rows=8192)
    only = {f"p{i:07d}" for i in range(0, 200_000, 4000)}

    def traced(read) -> tuple[object, float]:
        tracemalloc.start()
        try:
            result = read()
            return result, tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()

    some, some_mib = traced(lambda: read_predictions(str(tmp_path / "big"), only=only))
    whole, whole_mib = traced(lambda: read_predictions(str(tmp_path / "big")))
    assert len(some.values) == len(only & set(whole.values)) > 40 and some.products == whole.products > 180_000
    assert some_mib < 1 and whole_mib > 50, (some_mib, whole_mib)  # measured: 0.05 and 114 MiB
