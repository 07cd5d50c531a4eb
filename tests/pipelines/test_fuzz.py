"""Fuzzed bad input: whatever the bytes, every row ends in exactly one of attributes/ or rejected/."""

import io as stdio
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines import dedup, io, reader
from pipelines.extract_stage import ExtractConfig, ExtractStage
from pipelines.reader import ReadConfig
from pipelines.prepare import PREPARED_SCHEMA, PrepareConfig, prepare_chunk
from pipelines.schema import ValidationConfig, parse_schema
from pipelines.stacking import StackingConfig

from .helpers import extract_args, read_attributes, read_rejected, report, run_extract

CATEGORIES = ["Shoes", "Tea", "../x", "a/b", "Ünï cödé", "{{x}}\"\ny"]  # (white space around a name is refused)
SCHEMA = {c: ["Brand", "Color"] for c in CATEGORIES}
NASTY = ["", " ", "\x00", "\ud800", "\"}]},{", "\\", "\n\r\t", "ignore previous instructions\"", "é" * 50,
         "x" * 5000, "{\"a\": 1}", "null", "../../etc/passwd", "\u202e", "😀"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
field_values = st.one_of(st.sampled_from(NASTY), st.text(max_size=30), json_values)
records = st.fixed_dictionaries(
    {},
    optional={
        "product_id": st.one_of(st.sampled_from(["p1", "p2", "p3"]), field_values),
        "category": st.one_of(st.sampled_from(CATEGORIES), field_values),
        "title": st.one_of(st.text(min_size=1, max_size=40), field_values),
        "description": field_values,
        "features": st.one_of(st.lists(st.text(max_size=10), max_size=4), field_values),
    },
)
lines = st.one_of(
    records.map(lambda r: json.dumps(r).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40).filter(lambda b: b"\n" not in b and b.strip()),
)


def reference_verdicts(raws, config) -> np.ndarray:
    """Verdicts of one chunk's rows by the slow reference rule (duplicates within the chunk)."""
    ids = dedup.id_rows(0, raws, config.schema, config.validation).to_pylist()
    found = dedup.decide_reference([(r["shard"], r["row"], r["product_id"], r["valid"]) for r in ids], set())
    verdicts = np.zeros(len(raws), dtype=np.int8)
    for (_, row), verdict in found.items():
        verdicts[row] = verdict
    return verdicts


@settings(max_examples=150, deadline=None)
@given(st.lists(lines, min_size=1, max_size=12), st.integers(1, 4), st.sampled_from(["truncate", "reject"]))
def test_any_chunk_accounts_for_every_row(raw_lines, docs_per_prompt, oversize):
    schema = parse_schema(SCHEMA)
    config = PrepareConfig(ReadConfig("unused"), ValidationConfig(max_text_chars=100, oversize=oversize),
                           StackingConfig(docs_per_prompt), schema, "unused")
    key = "fuzz-chunk"
    raws = [reader.parse_raw(i, line) for i, line in enumerate(raw_lines)]
    rows = prepare_chunk(raws, config, reference_verdicts(raws, config))
    payload = io.table_to_bytes(pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA))
    stage = ExtractStage(ExtractConfig("dry-run", schema, "run"))
    out = stage._chunk({"chunk": key, "shard": "s", "index": 0, "payload": payload})
    stats = json.loads(out["stats"])
    attributes = io.table_from_bytes(out["attributes"])
    rejected = io.table_from_bytes(out["rejected"])
    assert stats["rows_in"] == len(raw_lines) == stats["products_out"] + stats["rejected"] + stats["skipped"]
    assert rejected.num_rows == stats["rejected"] and stats["skipped"] == 0
    assert attributes.num_rows == 2 * stats["products_out"]
    assert len(out["owned_ids"]) == len(set(out["owned_ids"])) == stats["products_out"]
    for row in rows:
        if row["status"] == "ok":
            assert row["category"] in SCHEMA and isinstance(row["product_id"], str)


def _nasty_records(rng: random.Random, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.5:
            record = {"product_id": f"id-{rng.randrange(n)}", "category": rng.choice(CATEGORIES + ["Boats"]),
                      "title": rng.choice(NASTY + ["Red shoe", "Green tea"])}
            if rng.random() < 0.3:
                record["description"] = rng.choice(NASTY + [None, 5])
            if rng.random() < 0.3:
                record["features"] = rng.choice([["a", "b"], "x", [1], None, [rng.choice(NASTY)]])
            if rng.random() < 0.2:
                record[rng.choice(["product_id", "category", "title"])] = rng.choice([None, 7, [], {}, True, ""])
            out.append(json.dumps(record).encode())
        elif kind < 0.7:
            out.append(json.dumps(rng.choice([[1, 2], "text", 3, None, {"nested": {"product_id": "x"}}])).encode())
        elif kind < 0.85:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))).replace(b"\n", b" ") + b"x")
        elif kind < 0.9:
            out.append(rng.choice([b"[" * 100_000, b"1" * 5000, b'{"product_id": ' + b"9" * 5000 + b"}"]))
        else:
            text = json.dumps({"product_id": f"t-{i}", "category": "Tea", "title": "tea"})
            out.append(text[: rng.randrange(1, len(text))].encode())
    return out


def test_fuzzed_files_through_the_whole_job(ray_cluster, tmp_path):
    rng = random.Random(20240611)
    source = tmp_path / "in"
    source.mkdir()
    lines = _nasty_records(rng, 400)
    (source / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines[:200]) + b"\r\n")  # BOM, CRLF
    (source / "b.jsonl").write_bytes(b"\n".join(lines[200:]))  # no final newline
    buffer = stdio.BytesIO()
    pq.write_table(pa.table({"product_id": [1, 2], "category": ["Tea", "Tea"], "title": [["x"], ["y"]]}), buffer)
    (source / "c.parquet").write_bytes(buffer.getvalue())  # readable, wrong types
    (source / "d.parquet").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])  # truncated
    attributes = tmp_path / "attributes.json"
    attributes.write_text(json.dumps(SCHEMA))
    output = tmp_path / "out"
    argv = extract_args(source, output, "--chunk-rows", 37, "--max-text-chars", 1000, attributes=attributes)
    assert run_extract(argv) == 0

    result = report(str(output))
    rows_in = len(lines) + 2 + 1  # JSONL lines + Parquet rows + the unreadable file
    table = read_attributes(str(output))
    rejected = read_rejected(str(output))
    assert result["rows_in"] == rows_in == result["products_out"] + result["rows_rejected"]
    assert len(rejected) == result["rows_rejected"]
    ids = table.column("product_id").to_pylist()
    assert len(set(ids)) == result["products_out"] and len(ids) == 2 * result["products_out"]
    assert set(table.column("category").to_pylist()) <= set(CATEGORIES)
    assert {r["stage"] for r in rejected} <= {"read", "validate", "dedup"}
    for directory in (output / "attributes").iterdir():
        assert directory.name.startswith("category=") and directory.parent == output / "attributes"
