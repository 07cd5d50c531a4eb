"""`hpd compact`: a finished output's small files packed into few, every row exactly once however
the compaction ends, and only a finished output that nothing else works on."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import attempts, compact, io
from pipelines import compact_journal as journal
from pipelines.commit import attributes_schema, chunk_key
from pipelines.compact import CompactConfig, File, compacted_name, plan_groups

from .helpers import extract_args, read_attributes, report, run_extract

CATEGORIES = {f"C{i:02d}": ["Brand", "Color"] for i in range(12)}
CHUNK_KEY = re.compile(r"^[0-9a-f]+-\d{6}$")


def many_files_input(tmp_path, rows: int = 360) -> tuple:
    """Records over 12 categories, with rows the job rejects (unknown category, a duplicate)."""
    records = [{"product_id": f"p{i:04d}", "category": f"C{i % 12:02d}", "title": f"product {i} red"} for i in range(rows)]
    records[7] = {"product_id": "x7", "category": "Nope", "title": "unknown category"}
    records[200] = dict(records[100])  # a duplicate of p0100
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    schema = tmp_path / "attributes.json"
    schema.write_text(json.dumps(CATEGORIES))
    return source, schema


@pytest.fixture(scope="module")
def finished(ray_cluster, tmp_path_factory):
    """A finished output of many small files (chunks of 30 rows): copy it to compact it."""
    folder = tmp_path_factory.mktemp("finished")
    source, schema = many_files_input(folder)
    output = folder / "out"
    assert run_extract(extract_args(source, output, "--chunk-rows", 30, "--group-chunks", 1, attributes=schema)) == 0
    return output


def copy_of(finished, tmp_path) -> str:
    target = tmp_path / "out"
    shutil.copytree(finished, target)
    return str(target)


def sorted_rows(output: str) -> tuple[pa.Table, pa.Table]:
    """Every attribute row (category from its folder) and every rejected row, sorted: a multiset."""
    values = read_attributes(output).sort_by([("category", "ascending"), ("product_id", "ascending"),
                                              ("attribute", "ascending")])
    fs, files = io.list_paths(io.join(output, "rejected"))
    rejected = pa.concat_tables([pq.read_table(i.path, filesystem=fs) for i in files if not i.base_name.startswith(".")])
    return values, rejected.sort_by([(c, "ascending") for c in rejected.column_names])


def data_files(output: str) -> list[str]:
    return [u for folder in ("attributes", "rejected") for u in io.list_files(io.join(output, folder))]


def test_groups_are_consecutive_small_files_up_to_the_target():
    files = [File(f"k-{i:06d}.parquet", size) for i, size in enumerate([10, 10, 60, 10, 10, 10, 30, 40, 10])]
    groups = plan_groups(list(reversed(files)), target_bytes=100)  # in name order, whatever the listing's
    assert [[f.name[2:8] for f in g] for g in groups] == [
        ["000000", "000001"],  # 60 >= half the target: stays, and cuts the run
        ["000003", "000004", "000005", "000006", "000007"],  # 100 bytes: the next would make 110
    ]  # 000008 alone: a group of one is left as it is
    assert plan_groups([File("a.parquet", 5)], 100) == []
    assert plan_groups([File("a.parquet", 50), File("b.parquet", 50)], 100) == []


def test_a_new_file_sorts_where_its_originals_did_and_is_never_a_chunk_key():
    before, first, after = (f"{chunk_key('c35030ad6253ab52', i)}.parquet" for i in (6, 7, 12))
    name = compacted_name(first)  # of 7 to 11
    assert before < name < after and name.endswith(".parquet")
    assert not CHUNK_KEY.match(name[: -len(".parquet")])
    assert compacted_name(name).startswith(first[: -len(".parquet")] + ".compacted-")  # compacted again: the same key


def test_a_finished_output_keeps_every_row_once_in_far_fewer_files(finished, tmp_path, capsys):
    output = copy_of(finished, tmp_path)
    before_rows, before_files = sorted_rows(output), data_files(output)
    result = compact.compact(CompactConfig(output, progress_seconds=0.1))
    after_files = data_files(output)
    assert sorted_rows(output)[0].equals(before_rows[0]) and sorted_rows(output)[1].equals(before_rows[1])
    partitions = len(CATEGORIES) + 1  # and rejected/
    assert len(before_files) > 3 * partitions and len(after_files) == partitions  # one file a partition here
    figures = result.figures
    assert (figures.partitions, figures.files_before, figures.files_after) == (partitions, len(before_files), partitions)
    assert figures.bytes_after == sum(os.path.getsize(u) for u in after_files) < figures.bytes_before
    assert all(".compacted-" in u for u in after_files)
    for name in (compact.MARKER, compact.JOURNAL):
        assert not os.path.exists(os.path.join(output, name))
    assert {a.command for a in attempts.load_all(output)} == {attempts.EXTRACT}  # its lease's record is gone
    done = io.read_json(io.join(output, compact.DONE))["runs"]
    assert len(done) == 1 and done[0]["files_before"] == len(before_files) and done[0]["files_after"] == partitions
    assert "partitions" in capsys.readouterr().err  # progress

    again = compact.compact(CompactConfig(output))  # nothing more to pack
    assert again.figures.groups == 0 and data_files(output) == after_files
    assert len(io.read_json(io.join(output, compact.DONE))["runs"]) == 2


def test_the_schema_stays_exactly_with_the_confidence_column_and_row_groups_are_few(tmp_path):
    output = str(tmp_path / "out")
    io.write_json(io.join(output, "_job.json"), {"run_id": "r"})
    io.write_json(io.join(output, "_report.json"), {"rows_rejected": 0})
    schema = attributes_schema(True).remove(1)  # the category is the folder
    rows = [{"product_id": f"p{i}", "attribute": "Brand", "value": None if i % 3 else "x", "truncated": False,
             "decoder": "hpd", "model": "m", "run_id": "r", "confidence": None if i % 3 else 0.5} for i in range(40)]
    for i in range(10):
        io.write_parquet(io.join(output, "attributes", "category=Tea", f"{chunk_key('ab', i)}.parquet"),
                         pa.Table.from_pylist(rows[4 * i: 4 * i + 4], schema=schema))
    compact.compact(CompactConfig(output, row_group_rows=16))
    (new,) = io.list_files(io.join(output, "attributes"))
    file = pq.ParquetFile(new)
    assert file.schema_arrow.equals(schema) and file.metadata.num_row_groups == 3  # 16 + 16 + 8 rows
    assert file.read().to_pylist() == rows  # in the originals' order


def test_only_a_finished_output_nothing_works_on_is_compacted(tmp_path):
    nothing = str(tmp_path / "nothing")
    with pytest.raises(ValueError, match=r"is not an `hpd extract` output \(no _job.json\)"):
        compact.compact(CompactConfig(nothing))
    output = str(tmp_path / "out")
    io.write_json(io.join(output, "_job.json"), {"run_id": "r"})
    with pytest.raises(ValueError, match=r"has not finished \(no _report.json yet\)"):
        compact.compact(CompactConfig(output))
    io.write_json(io.join(output, "_report.json"), {"rows_rejected": 0})
    now = time.time()  # an `hpd extract` on another host, alive
    other = attempts.save(output, attempts.Attempt("001-other-host-7", now - 5, now, "cpu", 2, 0.1))
    with pytest.raises(ValueError, match=r"another `hpd extract` is working on .*\(attempt 001-other-host-7: host "
                       "other-host, pid 7"):
        compact.compact(CompactConfig(output))
    attempts.save(output, dataclasses.replace(other, ended=True))
    assert compact.compact(CompactConfig(output)).figures.partitions == 0  # nothing to pack, but allowed


def test_an_extract_gives_way_to_a_compaction_and_the_message_says_which(tmp_path):
    output = str(tmp_path / "out")
    now = time.time()
    record = attempts.save(output, attempts.Attempt("001-other-host-9", now - 5, now, "cpu", 0, 0.0,
                                                    command=attempts.COMPACT))
    assert re.fullmatch(r"another `hpd compact` is working on .*out \(attempt 001-other-host-9: host other-host, pid 9, "
                        r"last seen \d s ago\): it is packing the output's files into fewer\. Wait for it to end or "
                        r"stop it", attempts.busy(output, None, 15))
    assert attempts.load_all(output) == [record]  # the field round-trips


def test_an_overwrite_gives_way_to_a_compaction_at_work(tmp_path):
    """`hpd extract --overwrite` first waits for the output's other attempts (``await_quiet``): a
    compaction's record (on another host), kept fresh, makes it give way instead of deleting files
    under it; so does a second compaction."""
    output = str(tmp_path / "out")
    io.write_json(io.join(output, "_job.json"), {"run_id": "r"})
    io.write_json(io.join(output, "_report.json"), {"rows_rejected": 0})
    now = time.time()
    record = attempts.save(output, attempts.Attempt("001-other-host-11", now, now, "cpu", 0, 0.0,
                                                    command=attempts.COMPACT))
    working = attempts.Heartbeat(output, record, 0.2)
    try:
        with pytest.raises(ValueError, match="another `hpd compact` is working on"):
            attempts.await_quiet(output, None, heartbeat_seconds=0.2, poll_seconds=0.05)
        with pytest.raises(ValueError, match="another `hpd compact` is working on"):
            compact.compact(CompactConfig(output, heartbeat_seconds=0.2))
    finally:
        working.stop()
    assert {a.name for a in attempts.load_all(output)} == {record.name}  # the refused one left no record


def test_a_dry_run_writes_nothing(finished, tmp_path):
    output = copy_of(finished, tmp_path)
    listing = io.list_files(output)
    result = compact.compact(CompactConfig(output, dry_run=True))
    assert io.list_files(output) == listing
    assert result.dry_run and result.figures.files_after == len(CATEGORIES) + 1 and result.as_json()["bytes_after"] is None
    assert [partition for partition, _ in result.planned] == [*(f"attributes/category=C{i:02d}" for i in range(12)),
                                                            "rejected"]


@pytest.mark.parametrize("deleted", [0, 1])  # originals deleted before the kill
def test_a_compaction_stopped_after_a_new_file_ends_with_every_row_once_when_run_again(finished, tmp_path, monkeypatch,
                                                                                        deleted):
    """Its group is undone (the new file deleted) where every original is still there, else finished."""
    output = copy_of(finished, tmp_path)
    before = sorted_rows(output)
    files = len(data_files(output))

    def fail(out, entry, check):
        io.delete_files([out.uri_of(f"{entry.partition}/{o.name}") for o in entry.originals[:deleted]])
        raise OSError("killed before the originals went")

    monkeypatch.setattr(journal, "delete_originals", fail)
    with pytest.raises(OSError, match="killed before"):
        compact.compact(CompactConfig(output, workers=1))
    # the first group's new file is in place beside its originals: some rows are there twice now
    assert io.exists(io.join(output, compact.MARKER)) and len(io.list_files(io.join(output, compact.JOURNAL))) == 1
    assert len(data_files(output)) == files + 1 - deleted and read_attributes(output).num_rows > before[0].num_rows
    with pytest.raises(ValueError, match="is being compacted, or a compaction was stopped there"):
        compact.check_readable(output)  # so readers wait
    monkeypatch.undo()

    result = compact.compact(CompactConfig(output))
    assert (result.finished_groups, result.undone_groups) == (deleted, 1 - deleted)
    after = sorted_rows(output)
    assert after[0].equals(before[0]) and after[1].equals(before[1])
    assert not io.exists(io.join(output, compact.MARKER)) and not io.list_files(io.join(output, compact.JOURNAL))
    assert len(data_files(output)) == len(CATEGORIES) + 1


def test_a_compaction_stopped_before_its_new_file_was_in_place_replaces_nothing(finished, tmp_path, monkeypatch):
    output = copy_of(finished, tmp_path)
    before = sorted_rows(output)
    def killed(*args):
        raise OSError("killed")

    monkeypatch.setattr(compact, "_stream", killed)
    monkeypatch.setattr(compact, "_undo_failed", lambda *args: None)  # killed: nothing undone on its way out
    with pytest.raises(OSError, match="killed"):
        compact.compact(CompactConfig(output, workers=1))
    (entry,) = io.list_files(io.join(output, compact.JOURNAL))
    new = io.join(output, io.read_json(entry)["new"])
    assert not io.exists(new)
    folder, name = new.rsplit("/", 1)
    with open(os.path.join(folder, f".tmp-{name}-0123"), "wb") as left:  # as a killed process leaves it
        left.write(b"partial")
    monkeypatch.undo()

    assert compact.compact(CompactConfig(output)).undone_groups == 1
    after = sorted_rows(output)
    assert after[0].equals(before[0]) and after[1].equals(before[1])
    assert not [n for n in os.listdir(folder) if n.startswith(".tmp-")]


def test_an_s3_output_is_compacted_and_a_stopped_compaction_finished(ray_cluster, s3_server, tmp_path, monkeypatch):
    source, schema = many_files_input(tmp_path, rows=240)
    output = f"s3://{s3_server.make_bucket()}/runs/out"
    assert run_extract(extract_args(source, output, "--chunk-rows", 30, "--group-chunks", 1, attributes=schema)) == 0
    before, files = sorted_rows(output), len(data_files(output))
    calls = []
    real = journal.delete_originals

    def fail_second(out, entry, check):  # the first group's originals go, one of the second's
        calls.append(entry)
        if len(calls) == 2:
            io.delete_files([out.uri_of(f"{entry.partition}/{entry.originals[0].name}")])
            raise OSError("killed")
        real(out, entry, check)

    monkeypatch.setattr(journal, "delete_originals", fail_second)
    with pytest.raises(OSError, match="killed"):
        compact.compact(CompactConfig(output, workers=1))
    monkeypatch.undo()
    built = []  # file systems: a new S3 one per request made the 8 workers 5x slower (here 109 s against 20 s)
    monkeypatch.setattr(io, "filesystem", lambda uri, real=io.filesystem: built.append(uri) or real(uri))
    result = compact.compact(CompactConfig(output))
    assert result.figures.groups >= 10 and len(built) < 20  # the checks and the lease's, none per partition or group
    assert not [uri for uri in built if any(f"/{part}" in uri for part in ("attributes", "rejected", compact.JOURNAL))]
    after = sorted_rows(output)
    assert after[0].equals(before[0]) and after[1].equals(before[1])
    assert result.finished_groups == 1 and len(data_files(output)) == len(CATEGORIES) + 1 < files
    assert not io.list_files(io.join(output, compact.JOURNAL)) and not io.exists(io.join(output, compact.MARKER))
    assert report(output)["products_out"] == read_attributes(output).group_by("product_id").aggregate([]).num_rows
