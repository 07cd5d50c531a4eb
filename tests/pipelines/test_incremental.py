"""Nightly incremental backfills: outputs at <prefix>dt=<date>/, each run with --skip-existing <prefix>
(the layout infra/k8s uses) does only products no earlier night has done."""

from __future__ import annotations

import json
import time

from pipelines import attempts, commit

from .helpers import extract_args, read_attributes, report, run_extract, sample_records


def _night(tmp_path, date: str, records: list[dict]) -> dict:
    inputs = tmp_path / "catalog" / f"dt={date}"
    inputs.mkdir(parents=True)
    (inputs / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    output = tmp_path / "attributes" / f"dt={date}"
    argv = extract_args(inputs, output, "--skip-existing", tmp_path / "attributes")
    assert run_extract(argv) == 0
    return {"report": report(str(output)), "ids": set(read_attributes(str(output)).column("product_id").to_pylist()),
            "argv": argv, "output": str(output)}


def test_nightly_runs_under_one_prefix_skip_exactly_what_is_done(ray_cluster, tmp_path):
    records = sample_records()
    first = _night(tmp_path, "2026-11-19", records[:12])  # the first night: nothing to skip yet
    assert first["report"]["rows_skipped"] == 0 and first["ids"] == {r["product_id"] for r in records[:12]}

    second = _night(tmp_path, "2026-11-20", records[:20])  # catalog grew by 8 products
    assert second["report"]["rows_skipped"] == 12
    assert second["ids"] == {r["product_id"] for r in records[12:20]}

    # Re-running night 2 (its own output lies under the prefix) resumes; it does not skip itself.
    assert run_extract(second["argv"]) == 0
    assert set(read_attributes(second["output"]).column("product_id").to_pylist()) == second["ids"]
    assert report(second["output"])["products_out"] == 8


def test_an_unfinished_earlier_output_counts_only_its_committed_chunks_and_is_closed(ray_cluster, tmp_path, capsys):
    """An earlier night that never finished (no _report.json; one chunk's commit lost): only the
    products of its committed chunks are done, so only those are skipped. The later night closes
    it: resumed afterwards, it used to write the rest again, so that those products were in both
    nights (helper-47, session 55); now its resume is refused. While an attempt works on it, the
    later night is refused instead, and leaves it open."""
    records = sample_records()[:20]
    inputs = tmp_path / "catalog.jsonl"
    inputs.write_text("".join(json.dumps(r) + "\n" for r in records))
    night1 = tmp_path / "attributes" / "dt=1"
    first = extract_args(inputs, night1, "--chunk-rows", 5)
    assert run_extract(first) == 0
    (night1 / "_report.json").unlink()
    lost = sorted((night1 / "_commits").glob("*/000001.json"))[0]
    lost_ids = set(json.loads(lost.read_text())["owned_ids"])
    lost.unlink()
    night2 = tmp_path / "attributes" / "dt=2"
    second = extract_args(inputs, night2, "--skip-existing", tmp_path / "attributes")

    now = time.time()  # an attempt on night 1 elsewhere, alive: night 2 would race it
    working = attempts.Heartbeat(str(night1), attempts.save(str(night1), attempts.Attempt(
        f"{int(now * 1000):015d}-other-host-5", now, now, "cpu", 2, 0.0425)), seconds=1.0)
    try:
        assert run_extract(second) == 2
    finally:
        attempts.remove(str(night1), working.stop(write=False))
    assert "the unfinished job in" in capsys.readouterr().err and not (night1 / commit.CLOSED).exists()

    assert run_extract(second) == 0
    assert report(str(night2))["rows_skipped"] == 15
    assert set(read_attributes(str(night2)).column("product_id").to_pylist()) == lost_ids
    held = set(read_attributes(str(night1)).column("product_id").to_pylist())
    capsys.readouterr()
    assert run_extract(first) == 2  # a resume of night 1 would write lost_ids again
    assert "is closed: `hpd extract --skip-existing` for" in capsys.readouterr().err
    assert set(read_attributes(str(night1)).column("product_id").to_pylist()) == held


def test_a_product_rejected_as_invalid_is_processed_once_its_record_is_corrected(ray_cluster, tmp_path):
    """An earlier output holds the products it wrote (or rejected in the decoder, or as duplicates of
    one it wrote), not those whose every record failed validation: a corrected record is processed by
    the next night, where it used to be skipped for good (a new user's walk, session 52)."""
    records = sample_records()[:12]
    broken = dict(records[3], title="  ")  # rejected at validation: an empty title
    first = _night(tmp_path, "1", [*records[:3], broken, *records[4:]])
    assert first["report"]["rows_rejected"] == 1 and records[3]["product_id"] not in first["ids"]
    manifests = (tmp_path / "attributes" / "dt=1" / "_commits").glob("*/*.json")
    held = {i for m in manifests if not m.name.startswith("_") for k in ("owned_ids", "rejected_ids")
            for i in json.loads(m.read_text())[k]}
    assert held == first["ids"]  # what an unfinished output would be taken to hold: not the invalid one
    second = _night(tmp_path, "2", records)  # its record corrected
    assert second["report"]["rows_skipped"] == 11 and second["ids"] == {records[3]["product_id"]}
