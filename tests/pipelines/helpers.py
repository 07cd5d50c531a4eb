"""Helpers for the pipeline tests: run `hpd extract`, read its outputs, make inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

from pipelines import io

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "oa-mine-sample.jsonl"
SAMPLE_ATTRIBUTES = REPO / "samples" / "attributes.json"


def sample_records() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


def by_slot(table, *columns: str) -> dict:
    """(product_id, attribute) -> the row's ``columns`` (one column: its value alone)."""
    rows = table.select(["product_id", "attribute", *columns]).to_pylist()
    pick = (lambda r: r[columns[0]]) if len(columns) == 1 else (lambda r: tuple(r[c] for c in columns))
    return {(r["product_id"], r["attribute"]): pick(r) for r in rows}


def extract_args(input_uri, output_uri, *extra, attributes=SAMPLE_ATTRIBUTES) -> list[str]:
    return ["--input", str(input_uri), "--attributes", str(attributes), "--output", str(output_uri),
            "--decoder", "dry-run", *map(str, extra)]


def run_extract(argv: list[str]) -> int:
    """`hpd extract` in this process, through the CLI entry point (it joins the session's Ray)."""
    from jobs.cli import main

    return main(["extract", *map(str, argv)])


def start_extract(argv: list[str], address: str, env: dict | None = None, ctrl_c: bool = False) -> subprocess.Popen:
    """`hpd extract` as a separate driver process joined to the session's Ray.

    ``ctrl_c``: the driver takes SIGINT as a terminal's Ctrl-C, even when the tests themselves were
    started in the background of a shell, which starts them with SIGINT ignored (children inherit
    that, and Python then never raises KeyboardInterrupt).
    """
    command = [sys.executable, "-m", "jobs.cli", "extract", *argv, "--address", address]
    restore = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if ctrl_c else None
    return subprocess.Popen(command, cwd=REPO, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=restore)


CATEGORY_PARTITION = pads.partitioning(pa.schema([("category", pa.string())]), flavor="hive")


def read_attributes(output_uri: str) -> pa.Table:
    """The attribute rows, with ``category`` from the partition directories read as strings (as the
    README says: inferring their type would read a category "007" as the number 7)."""
    fs, path = io.filesystem(io.join(output_uri, "attributes"))
    dataset = pads.dataset(path, filesystem=fs, format="parquet", partitioning=CATEGORY_PARTITION)
    return dataset.to_table()


def read_rejected(output_uri: str) -> list[dict]:
    rows = []
    for uri in io.list_files(io.join(output_uri, "rejected")):
        fs, path = io.filesystem(uri)
        rows += pads.dataset(path, filesystem=fs, format="parquet").to_table().to_pylist()
    return rows


def report(output_uri: str) -> dict:
    return io.read_json(io.join(output_uri, "_report.json"))


def commits(output_uri: str) -> list[str]:
    return [u for u in io.list_files(io.join(output_uri, "_commits")) if not u.rsplit("/", 1)[1].startswith("_")]


def upload(s3_server, bucket: str, key: str, data: bytes) -> str:
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def jsonl(records: list) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()


WAIT_SECONDS = 120


def catalog(n: int) -> tuple[list, set]:
    """n records over the sample's categories (unique ids), plus a duplicate and two bad rows."""
    sample = sample_records()
    records = [dict(sample[i % len(sample)], product_id=f"p{i:05d}") for i in range(n)]
    records[n // 2 :: 97] = [dict(r, product_id="p00001") for r in records[n // 2 :: 97]]  # duplicates of p00001
    records.insert(n // 3, {"product_id": "bad", "category": "Nope", "title": "x"})
    records.insert(n // 4, "{not json")
    valid = {r["product_id"] for r in records if isinstance(r, dict) and r["category"] != "Nope"}
    return records, valid


def wait_for(condition, what: str):
    deadline = time.time() + WAIT_SECONDS
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def check_exactly_once(output: str, records: list, valid: set) -> dict:
    """Each valid product once in attributes/ (all its attributes, no duplicate rows), each bad row
    once in rejected/, and the report agrees."""
    schema = json.loads(SAMPLE_ATTRIBUTES.read_text())
    rows = read_attributes(output).select(["product_id", "category", "attribute"]).to_pylist()
    assert max(Counter((r["product_id"], r["attribute"]) for r in rows).values()) == 1
    by_product = defaultdict(set)
    for row in rows:
        by_product[row["product_id"]].add((row["category"], row["attribute"]))
    assert set(by_product) == valid  # none lost, none extra
    for pairs in by_product.values():
        (category,) = {c for c, _ in pairs}
        assert {a for _, a in pairs} == set(schema[category])
    result = report(output)
    assert len(rows) == result["attribute_rows"]
    assert len(read_rejected(output)) == result["rows_rejected"] == len(records) - len(valid)
    assert result["rows_in"] == len(records) == result["products_out"] + result["rows_rejected"]
    return result
