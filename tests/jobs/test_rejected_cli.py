"""`hpd rejected`: a finished job's rejected rows by stage and reason, and their records as an input
for a corrected run, which then writes the products the first run could not."""

from __future__ import annotations

import json
import os
import stat

import pytest

from jobs import cli
from pipelines import io
from tests.pipelines.helpers import extract_args, jsonl, read_attributes, report, run_extract


def records() -> list:
    tea = [{"product_id": f"p{i}", "category": "Tea", "title": f"tea {i}"} for i in range(10)]
    bad = [{"product_id": "x1", "category": "Nope", "title": "what"}, "{not json",
           {"product_id": "p3", "category": "Tea", "title": "tea again"}]  # unknown category, unreadable, duplicate
    return tea[:5] + bad + tea[5:]


def last_json(capsys) -> tuple[dict, str]:
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


def test_rejected_rows_by_stage_and_their_records_run_again(ray_cluster, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records()))
    first = tmp_path / "first"
    argv = extract_args(source, first, "--docs-per-prompt", 2, "--dry-run-fail", "p7")  # p7's prompt fails
    assert run_extract(argv) == 0
    assert report(str(first))["rows_rejected"] == 5
    capsys.readouterr()

    assert cli.main(["rejected", str(first)]) == 0
    result, said = last_json(capsys)
    assert result["rejected"] == 5
    assert result["by_stage"] == {"read": 1, "validate": 1, "dedup": 1, "extract": 2}
    assert "5 rejected row(s): read 1, validate 1, dedup 1, extract 2" in said
    assert {"stage": "dedup", "reason": "duplicate product_id", "rows": 1} in result["reasons"]

    retry = tmp_path / "retry.jsonl"
    assert cli.main(["rejected", str(first), "--stage", "extract", "--out", str(retry)]) == 0
    result, said = last_json(capsys)
    assert result["rejected"] == 2 and result["by_stage"] == {"extract": 2} and result["out"] == str(retry)
    assert "2 rejected row(s) of 5 (left out: read 1, validate 1, dedup 1): extract 2" in said
    assert result["left_out"] == {"read": 1, "validate": 1, "dedup": 1} and "later copies" not in said  # --stage
    again = [json.loads(line) for line in retry.read_text().splitlines()]
    failed = {r["product_id"] for r in again}
    assert len(failed) == 2 and "p7" in failed and all(r["category"] == "Tea" for r in again)  # the originals

    second = tmp_path / "second"
    assert run_extract(extract_args(retry, second, "--docs-per-prompt", 2)) == 0  # the decoder works now
    assert set(read_attributes(str(second)).column("product_id").to_pylist()) == failed
    assert report(str(second))["rows_rejected"] == 0


def test_every_stage_can_be_written_and_an_unreadable_line_stays_as_it_was(ray_cluster, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records()))
    output = tmp_path / "out"
    assert run_extract(extract_args(source, output)) == 0
    out = tmp_path / "rejected.jsonl"
    assert cli.main(["rejected", str(output), "--stage", "read", "--stage", "validate", "--out", str(out)]) == 0
    assert out.read_text().splitlines() == [json.dumps(records()[5]), '{not json']  # in file order, as they were


def test_an_unfinished_or_foreign_output_is_refused(tmp_path, capsys):
    assert cli.main(["rejected", str(tmp_path / "nothing")]) == 2
    assert "is not an hpd extract output" in capsys.readouterr().err
    io.write_json(str(tmp_path / "running" / "_job.json"), {"run_id": "x"})
    assert cli.main(["rejected", str(tmp_path / "running")]) == 2
    assert "has not finished (no _report.json yet" in capsys.readouterr().err


def test_rows_missing_from_rejected_files_are_an_error_not_a_short_count(ray_cluster, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records()))
    output = tmp_path / "out"
    assert run_extract(extract_args(source, output)) == 0
    for uri in io.list_files(str(output / "rejected")):
        io.delete_if_exists(uri)
    capsys.readouterr()
    assert cli.main(["rejected", str(output)]) == 2
    assert "rejected/ holds 0 rows, its report says 3" in capsys.readouterr().err


@pytest.mark.parametrize("stage", ["nope"])
def test_an_unknown_stage_is_refused_by_the_command_line(stage, capsys):
    with pytest.raises(SystemExit):
        cli.main(["rejected", "out", "--stage", stage])
    assert "invalid choice" in capsys.readouterr().err


def test_on_s3_the_records_file_appears_whole(ray_cluster, s3_server, tmp_path, capsys):
    bucket = s3_server.make_bucket("rejected")
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records()))
    output = f"s3://{bucket}/out"
    assert run_extract(extract_args(source, output, "--docs-per-prompt", 2, "--dry-run-fail", "p7")) == 0
    capsys.readouterr()
    retry = f"s3://{bucket}/retry/extract.jsonl"
    assert cli.main(["rejected", output, "--stage", "extract", "--out", retry]) == 0
    result, _ = last_json(capsys)
    lines = io.read_bytes(retry).decode().splitlines()
    assert result["rejected"] == len(lines) == 2 and "p7" in {json.loads(line)["product_id"] for line in lines}


def test_a_check_that_fails_leaves_no_records_file(ray_cluster, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records()))
    output = tmp_path / "out"
    assert run_extract(extract_args(source, output)) == 0
    io.delete_if_exists(io.list_files(str(output / "rejected"))[0])
    out = tmp_path / "records" / "rejected.jsonl"
    assert cli.main(["rejected", str(output), "--out", str(out)]) == 2
    assert not out.exists() and list((tmp_path / "records").iterdir()) == []  # nor a temporary file


def test_out_leaves_later_copies_out_unless_asked_and_is_read_like_a_plain_file(ray_cluster, tmp_path, capsys):
    """--out without --stage writes every stage but dedup (a later copy of a product the job wrote
    would be written twice); a leftover hidden temporary file of an interrupted local write is not a
    rejected file; the records file gets the umask's mode, not mkstemp's 0600; a folder is refused."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records()))
    output = tmp_path / "out"
    assert run_extract(extract_args(source, output, "--docs-per-prompt", 2, "--dry-run-fail", "p7")) == 0
    (output / "rejected" / ".tmp-x.parquet-0123").write_bytes(b"PAR1 cut short")  # as a killed write leaves it
    capsys.readouterr()
    out = tmp_path / "again.jsonl"
    assert cli.main(["rejected", str(output), "--out", str(out)]) == 0
    result, said = last_json(capsys)
    assert result["by_stage"] == {"read": 1, "validate": 1, "extract": 2} and result["rejected"] == 4
    assert result["left_out"] == {"dedup": 1}  # the report's 5 rejected: what is not in --out is said
    assert "4 rejected row(s) of 5 (left out: dedup 1): read 1, validate 1, extract 2" in said
    assert f"records of 4 row(s): {out}; not of the 1 dedup row(s), later copies of products the job wrote" in said
    assert "tea again" not in out.read_text()  # the duplicate of p3
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert cli.main(["rejected", str(output), "--stage", "dedup", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["title"] == "tea again"
    result, said = last_json(capsys)
    assert result["left_out"] == {"read": 1, "validate": 1, "extract": 2} and "later copies" not in said
    assert cli.main(["rejected", str(output)]) == 0  # without --out: every stage, nothing left out
    assert last_json(capsys)[0]["left_out"] == {}
    capsys.readouterr()
    assert cli.main(["rejected", str(output), "--out", str(tmp_path)]) == 2
    assert "is a folder: name the file to write" in capsys.readouterr().err


def test_a_nightly_retry_under_the_prefix_is_seen_by_later_nights(ray_cluster, tmp_path, capsys):
    """The README's incremental flow: night 1 writes <prefix>dt=1/ and its decoder fails on p7's
    prompt; the retry runs those records into <prefix>dt=1-retry/ (without --skip-existing: the
    first output holds them, as rejected); night 2 over the same input with --skip-existing <prefix>
    then skips every product of night 1, and decodes only a new one."""
    prefix = f"{tmp_path}/values/"
    source = tmp_path / "night1.jsonl"
    source.write_bytes(jsonl(records()))
    assert run_extract(extract_args(source, f"{prefix}dt=1", "--docs-per-prompt", 2, "--dry-run-fail", "p7")) == 0
    retry = tmp_path / "retry.jsonl"
    assert cli.main(["rejected", f"{prefix}dt=1", "--stage", "extract", "--out", str(retry)]) == 0
    assert run_extract(extract_args(retry, f"{prefix}dt=1-retry", "--docs-per-prompt", 2)) == 0
    retried = set(read_attributes(f"{prefix}dt=1-retry").column("product_id").to_pylist())
    assert "p7" in retried and len(retried) == 2

    night2 = tmp_path / "night2.jsonl"
    night2.write_bytes(jsonl([*records(), {"product_id": "p99", "category": "Tea", "title": "new tea"}]))
    assert run_extract(extract_args(night2, f"{prefix}dt=2", "--skip-existing", prefix)) == 0
    assert set(read_attributes(f"{prefix}dt=2").column("product_id").to_pylist()) == {"p99"}
    # p0..p9 (written on night 1 or by its retry) and the later copy of p3; not x1, rejected there at
    # validation (an unknown category), which night 2 reads and rejects again (its record may have been corrected)
    assert report(f"{prefix}dt=2")["rows_skipped"] == 11
    assert report(f"{prefix}dt=2")["rejected_by_stage"] == {"read": 1, "validate": 1}
