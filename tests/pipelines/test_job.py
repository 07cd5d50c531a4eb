"""`hpd extract` end to end on a real local Ray and a real local S3 server (dry-run decoder)."""

import io as stdio
import json
from collections import Counter, defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import io
from pipelines.schema import partition_value

from .helpers import (
    CATEGORY_PARTITION,
    SAMPLE_ATTRIBUTES,
    commits,
    extract_args,
    jsonl,
    read_attributes,
    read_rejected,
    report,
    run_extract,
    sample_records,
    upload,
)

UNSAFE = ["../../etc", "a/b", "."]
ODD = ["007", "Ünï cödé 50%"]  # a number to a reader that infers partition types; non-ASCII and %


def _parquet_bytes(records):
    sink = stdio.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), sink)
    return sink.getvalue()


@pytest.fixture(scope="module")
def s3_job(ray_cluster, s3_server, tmp_path_factory):
    """One job: an S3 prefix of JSONL + Parquet + junk, with every kind of bad row, to S3."""
    bucket = s3_server.make_bucket("job")
    schema = json.loads(SAMPLE_ATTRIBUTES.read_text())
    schema.update({"../../etc": ["Brand"], "a/b": ["Color", "Size"], ".": ["Brand"], "007": ["Brand"], ODD[1]: ["Size"]})
    attributes = tmp_path_factory.mktemp("job") / "attributes.json"
    attributes.write_text(json.dumps(schema))
    sample = sample_records()
    good = sample + [
        {"product_id": f"unsafe-{i}", "category": c, "title": f"thing {i}"} for i, c in enumerate(UNSAFE + ODD)
    ] + [{"product_id": "long", "category": "Tea", "title": "Tea", "description": "d" * 1000}]
    bad_json = [
        ({"product_id": "", "category": "Tea", "title": "x"}, "empty product_id"),
        ({"product_id": "nocat", "title": "x"}, "missing category"),
        ({"product_id": "boat", "category": "Boats", "title": "x"}, "unknown category"),
        ({"product_id": "num", "category": "Tea", "title": 123}, "title must be a string"),
        ({"product_id": "feat", "category": "Tea", "title": "x", "features": "no"}, "features must be a list"),
        ('{"product_id": "broken", "category": ', "malformed JSON line (JSON Lines: one object per line): "),
        ("[1, 2, 3]", "record must be a JSON object, got list (JSON Lines: one object per line, not an array)"),
        ('{"product_id": "twice", "category": "Tea", "title": "Green tea", "title": "Black tea"}',
         "a key given more than once: ['title'] (JSON would keep only the last)"),
    ]
    part0 = jsonl(good[:25] + [r for r, _ in bad_json] + good[25:])
    parquet_rows = [
        {"product_id": "pq-1", "category": "Shoes", "title": "Parquet shoe", "description": None, "features": ["x"]},
        {"product_id": "pq-2", "category": "Coffee", "title": "Parquet coffee", "description": "d", "features": []},
        {"product_id": sample[0]["product_id"], "category": "Tea", "title": "dup", "description": None, "features": None},
    ]
    upload(s3_server, bucket, "input/part-0.jsonl", part0)
    upload(s3_server, bucket, "input/part-1.parquet", _parquet_bytes(parquet_rows))
    upload(s3_server, bucket, "input/part-2.csv", b"a,b\n")
    upload(s3_server, bucket, "input/_SUCCESS", b"")
    output = f"s3://{bucket}/out"
    argv = extract_args(f"s3://{bucket}/input", output, "--chunk-rows", 8, "--docs-per-prompt", 3,
                        "--max-text-chars", 300, attributes=attributes)
    assert run_extract(argv) == 0
    return {
        "bucket": bucket, "output": output, "argv": argv, "schema": schema, "attributes": attributes,
        "good": good + parquet_rows[:2], "dup": (sample[0], parquet_rows[2]), "bad_json": bad_json,
        "rows_in": len(good) + len(bad_json) + len(parquet_rows) + 1,
    }


def test_every_row_ends_in_exactly_one_place(s3_job):
    result = report(s3_job["output"])
    table = read_attributes(s3_job["output"])
    rejected = read_rejected(s3_job["output"])
    assert result["rows_in"] == s3_job["rows_in"]
    assert result["products_out"] + result["rows_rejected"] == result["rows_in"]
    assert result["rows_rejected"] == len(rejected) == len(s3_job["bad_json"]) + 2  # + csv file + duplicate

    by_product = defaultdict(list)
    for row in table.to_pylist():
        by_product[row["product_id"]].append(row)
    expected = {r["product_id"]: r for r in s3_job["good"]}
    assert set(by_product) == set(expected) and len(by_product) == result["products_out"]
    for product_id, rows in by_product.items():
        category = expected[product_id]["category"]
        assert [r["category"] for r in rows] == [category] * len(rows)  # the path decodes to the original
        assert sorted(r["attribute"] for r in rows) == sorted(s3_job["schema"][category])
        assert {(r["decoder"], r["model"], r["run_id"]) for r in rows} == {("dry-run", "none", result["run_id"])}
        assert all(r["value"] is None for r in rows)
        assert all(r["truncated"] == (product_id == "long") for r in rows)
    assert result["attribute_rows"] == table.num_rows
    assert result["inputs_truncated"] == 1

    reasons = defaultdict(list)
    for row in rejected:
        reasons[row["reason"].split(":")[0]].append(row)
        assert row["run_id"] == result["run_id"]
    for record, reason in s3_job["bad_json"]:
        match = [r for r in rejected if reason in r["reason"]]
        assert len(match) == 1, reason
        assert match[0]["record"] == (record if isinstance(record, str) else json.dumps(record))
    (unsupported,) = [r for r in rejected if "unsupported file type" in r["reason"]]
    assert unsupported["stage"] == "read" and json.loads(unsupported["record"])["file"].endswith("part-2.csv")
    (duplicate,) = [r for r in rejected if r["reason"] == "duplicate product_id"]
    assert duplicate["stage"] == "dedup"
    assert json.loads(duplicate["record"]) in [dict(s3_job["dup"][0]), dict(s3_job["dup"][1])]
    assert result["rejected_by_stage"] == {"dedup": 1, "read": 3, "validate": len(s3_job["bad_json"]) - 2}  # read: csv, malformed, key twice


def test_partitions_are_path_safe_and_stay_under_the_output(s3_job, s3_server):
    keys = [
        o["Key"]
        for page in s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=s3_job["bucket"])
        for o in page.get("Contents", [])
    ]
    outputs = [k for k in keys if not k.startswith("input/")]
    assert all(k.startswith("out/") for k in outputs)
    partitions = {k.split("/")[2] for k in outputs if k.startswith("out/attributes/")}
    for directory in partitions:
        value = directory.removeprefix("category=")
        assert directory.startswith("category=") and value not in (".", "..") and "." not in value
    assert {f"category={partition_value(c)}" for c in UNSAFE} <= partitions
    assert "category=%2E%2E%2F%2E%2E%2Fetc" in partitions


def test_the_output_reads_as_one_table_with_pandas_and_pyarrow(s3_job):
    """What a user does first: read the whole attributes/ folder. Files that also held a category
    column made pandas and pyarrow.parquet refuse it (string column vs dictionary partition)."""
    import pandas as pd

    fs, path = io.filesystem(io.join(s3_job["output"], "attributes"))
    expected = sorted((r["product_id"], r["category"], r["attribute"]) for r in read_attributes(s3_job["output"]).to_pylist())
    assert {c for _, c, _ in expected} >= set(UNSAFE + ODD)
    inferred = pq.read_table(path, filesystem=fs).to_pylist()  # partition type inferred (strings here)
    assert sorted((r["product_id"], r["category"], r["attribute"]) for r in inferred) == expected
    frame = pd.read_parquet(path, filesystem=fs)
    assert sorted(zip(frame["product_id"], frame["category"].astype(str), frame["attribute"])) == expected
    typed = pd.read_parquet(path, filesystem=fs, partitioning=CATEGORY_PARTITION)  # as the README shows
    assert sorted(zip(typed["product_id"], typed["category"], typed["attribute"])) == expected


def test_report_fields(s3_job):
    result = report(s3_job["output"])
    for field in ("rows_in", "products_out", "rows_rejected", "wall_seconds", "device", "device_seconds",
                  "products_per_second_per_device", "prompt_tokens", "generated_tokens", "forward_passes",
                  "usd_per_1k_products", "price_per_hour", "run_id", "decoder", "model", "adapter", "attempts"):
        assert field in result, field
    assert result["device"] == "cpu" and result["cpu_seconds"] == result["device_seconds"] > 0
    assert result["price_per_hour"] == 0.0425 and result["price_unit"] == "vCPU-hour"  # a CPU run: the CPU price
    assert result["prompts"] > 0 and result["forward_passes"] == result["prompts"]
    assert result["products_per_prompt"] == round(result["products_out"] / result["prompts"], 2)
    assert result["prompt_tokens"] > 0 and result["generated_tokens"] == result["attribute_rows"]
    by_category = result["by_category"]  # per category, adding up to the job's counters
    assert sum(row["products"] for row in by_category.values()) == result["products_out"]
    assert sum(row["attribute_rows"] for row in by_category.values()) == result["attribute_rows"]
    assert sum(row["attribute_rows"] - row["values"] for row in by_category.values()) == result["values_null"]
    written = Counter(row["category"] for row in read_attributes(s3_job["output"]).to_pylist())
    assert {name: row["attribute_rows"] for name, row in by_category.items()} == dict(written)
    cost = result["device_seconds"] / 3600 * 0.0425 / result["products_out"] * 1000
    assert result["usd_per_1k_products"] == pytest.approx(cost, rel=1e-3)
    fs, path = io.filesystem(io.join(s3_job["output"], "_report.md"))
    with fs.open_input_stream(path) as stream:
        text = stream.read().decode()
    assert result["run_id"] in text and "products/s per vCPU" in text and "per vCPU-hour" in text


def test_rerun_of_a_finished_job_does_nothing_and_keeps_its_report(s3_job, capsys, monkeypatch):
    import ray

    def must_not_run(*args, **kwargs):
        raise AssertionError("a finished job was run again")

    monkeypatch.setattr(ray, "init", must_not_run)
    monkeypatch.setattr("pipelines.build.run_job", must_not_run)
    before = {uri: io.read_json(uri)["committed_at"] for uri in commits(s3_job["output"])}
    report_before = report(s3_job["output"])
    capsys.readouterr()
    assert run_extract(s3_job["argv"]) == 0
    assert "already complete" in capsys.readouterr().err
    after = {uri: io.read_json(uri)["committed_at"] for uri in commits(s3_job["output"])}
    assert after == before and report(s3_job["output"]) == report_before  # not the no-op run's report
    assert report_before["products_out"] + report_before["rows_rejected"] == report_before["rows_in"] == s3_job["rows_in"]


def test_different_arguments_into_the_same_output_are_refused(s3_job, capsys):
    argv = [a if a != "3" else "2" for a in s3_job["argv"]]  # --docs-per-prompt 2
    assert run_extract(argv) == 2
    err = capsys.readouterr().err
    assert "holds another job" in err and "--docs-per-prompt (there: 3; here: 2)" in err and "--overwrite" in err
    assert "--input" not in err and "--chunk-rows" not in err  # only what differs


def test_skip_existing_processes_only_new_products(s3_job, s3_server):
    bucket = s3_job["bucket"]
    old = sample_records()[:10]
    new = [{"product_id": f"new-{i}", "category": "Tea", "title": f"tea {i}"} for i in range(5)]
    # in the earlier rejected/ at validation: not held there, so read and rejected again (its record may be corrected)
    rejected_before = {"product_id": "boat", "category": "Boats", "title": "x"}
    upload(s3_server, bucket, "nightly/part-0.jsonl", jsonl(old + new + [rejected_before]))
    output = f"s3://{bucket}/nightly-out"
    argv = extract_args(f"s3://{bucket}/nightly", output, "--skip-existing", s3_job["output"],
                        attributes=s3_job["attributes"])
    assert run_extract(argv) == 0
    result = report(output)
    assert result["rows_skipped"] == 10 and result["products_out"] == 5 and result["rows_rejected"] == 1
    assert set(read_attributes(output).column("product_id").to_pylist()) == {r["product_id"] for r in new}
