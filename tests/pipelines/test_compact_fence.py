"""`hpd compact` paused and taken over: a woken compaction changes nothing of the output that the
taker wrote (no row lost, none twice), ends on its lost lease, and leaves no marker; a compaction
that fails every time leaves the output readable; a killed one's leftovers go.

A pause is simulated by running the taker in this process at a named point of the compaction (the
taker sees the paused one's record as a killed driver's: its pid is this process's), so the taker
runs to its end in the middle of the other, as a SIGSTOP of 45 s or more allows."""

from __future__ import annotations

import contextlib
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import cli
from pipelines import attempts, compact, io
from pipelines.commit import chunk_key
from pipelines.compact import CompactConfig

from .helpers import extract_args, run_extract
from .test_compact import CATEGORIES, copy_of, data_files, finished, many_files_input, sorted_rows  # noqa: F401


def once(action):
    """``action`` at the first call only."""
    done = []

    def run():
        if not done:
            done.append(True)
            action()
    return run


def after_new_file(monkeypatch, action) -> None:
    """``action`` right after the first new file is put in place (``io.writing`` ended)."""
    real, run = io.writing, once(action)

    @contextlib.contextmanager
    def writing(uri):
        with real(uri) as local:
            yield local
        if ".compacted-" in uri:
            run()
    monkeypatch.setattr(io, "writing", writing)


def before_upload(monkeypatch, action) -> None:
    """``action`` right before the first new file is uploaded (S3), after the lease was checked."""
    real, run = io.put_file, once(action)

    def put_file(local, uri):
        if ".compacted-" in uri:
            run()
        real(local, uri)
    monkeypatch.setattr(io, "put_file", put_file)


def overwrite(finished, output, *extra) -> callable:
    """`hpd extract --overwrite` of the same job (or ``extra``) into ``output``: files of the same names."""
    def run():
        args = extract_args(finished.parent / "in.jsonl", output, "--chunk-rows", 30, "--group-chunks", 1,
                            "--overwrite", *extra, attributes=finished.parent / "attributes.json")
        assert run_extract(args) == 0
    return run


def stamped(output: str) -> list[tuple]:
    """Every data file's name and content (the run id tells one job from another)."""
    return [(u.rsplit("/", 1)[-1], pq.read_table(u).to_pylist()) for u in data_files(output)]


@pytest.mark.parametrize("point", ["new file in place", "first original deleted"])
def test_a_compaction_woken_after_an_overwrite_deletes_none_of_its_files(finished, tmp_path, monkeypatch, point):
    """Finding 1 of review 53: the overwrite's chunk files have the names of the compaction's originals."""
    output = copy_of(finished, tmp_path)
    taken = {}

    def take_over():
        overwrite(finished, output)()
        taken["files"] = stamped(output)

    if point == "new file in place":
        after_new_file(monkeypatch, take_over)
    else:
        real, run = os.unlink, once(take_over)

        def unlink(path, *args, **kwargs):
            real(path, *args, **kwargs)
            if "/attributes/" in str(path) and ".tmp-" not in str(path) and str(path).endswith(".parquet"):
                run()
        monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(Exception) as raised:
        compact.compact(CompactConfig(output, workers=1))
    monkeypatch.undo()
    assert stamped(output) == taken["files"]  # the new job's files, every one, as it wrote them
    assert not io.exists(io.join(output, compact.MARKER))
    assert raised.type is attempts.LostLeaseError and "lost its lease on" in str(raised.value)


def test_a_compaction_woken_after_another_finished_it_ends_on_its_lost_lease(finished, tmp_path, monkeypatch):
    """Finding 8: the taker undid the paused one's group and deleted its files; the woken one's error is
    its lost lease, not the missing file it trips on."""
    output = copy_of(finished, tmp_path)
    before = sorted_rows(output)
    after_new_file(monkeypatch, lambda: compact.compact(CompactConfig(output)))
    with pytest.raises(Exception) as raised:
        compact.compact(CompactConfig(output, workers=1))
    monkeypatch.undo()
    after = sorted_rows(output)
    assert after[0].equals(before[0]) and after[1].equals(before[1])
    assert len(data_files(output)) == len(CATEGORIES) + 1
    assert not io.exists(io.join(output, compact.MARKER)) and not io.exists(io.join(output, compact.JOURNAL))
    assert {a.command for a in attempts.load_all(output)} == {attempts.EXTRACT}  # the paused one's record went
    assert raised.type is attempts.LostLeaseError and "lost its lease on" in str(raised.value)


@pytest.mark.slow  # 30 s; the default run holds the same fence on local files (a new file in place, then taken over)
@pytest.mark.parametrize("taker", ["compact", "overwrite"])
def test_an_s3_compaction_woken_before_its_upload_deletes_what_it_uploaded(ray_cluster, s3_server, tmp_path,
                                                                          monkeypatch, taker):
    """Findings 2 and 3: the taker (another compaction, or an --overwrite of another input) ran to its
    end between the paused one's lease check and its upload (no rename on S3)."""
    source, schema = many_files_input(tmp_path, rows=240)
    output = f"s3://{s3_server.make_bucket()}/runs/out"
    args = extract_args(source, output, "--chunk-rows", 30, "--group-chunks", 1, attributes=schema)
    assert run_extract(args) == 0
    other = tmp_path / "other.jsonl"
    other.write_text("".join(line.replace('"title": "product', '"title": "item')
                             for line in source.read_text().splitlines(keepends=True)[:120]))

    def take_over():
        if taker == "compact":
            compact.compact(CompactConfig(output))
        else:
            assert run_extract(extract_args(other, output, "--chunk-rows", 30, "--group-chunks", 1, "--overwrite",
                                            attributes=schema)) == 0
        take_over.rows = sorted_rows(output)

    before_upload(monkeypatch, take_over)
    with pytest.raises(Exception) as raised:
        compact.compact(CompactConfig(output, workers=1))
    monkeypatch.undo()
    after = sorted_rows(output)
    assert after[0].equals(take_over.rows[0]) and after[1].equals(take_over.rows[1])  # nothing of the woken one's
    assert not io.exists(io.join(output, compact.MARKER))
    assert raised.type is attempts.LostLeaseError and "lost its lease on" in str(raised.value)


def test_a_compaction_woken_before_its_marker_leaves_none(finished, tmp_path, monkeypatch):
    """Finding 5: another compaction ran to its end meanwhile; the woken one's marker would make readers
    refuse a fully compacted output."""
    output = copy_of(finished, tmp_path)
    real, run = io.write_json, once(lambda: compact.compact(CompactConfig(output)))

    def write_json(uri, data):
        if uri.endswith(compact.MARKER):
            run()
        real(uri, data)
    monkeypatch.setattr(io, "write_json", write_json)
    with pytest.raises(attempts.LostLeaseError) as lost:
        compact.compact(CompactConfig(output))
    monkeypatch.undo()
    assert "goes on with the job" not in str(lost.value)  # the taker had ended
    compact.check_readable(output)
    assert len(data_files(output)) == len(CATEGORIES) + 1


def test_a_file_of_another_schema_leaves_the_output_readable_and_says_so(finished, tmp_path, capsys):
    """Finding 6: an error that comes back at every run undoes its group and removes the marker."""
    output = copy_of(finished, tmp_path)
    folder = io.join(output, "attributes", "category=C03")
    odd = pa.table({"product_id": ["h1"], "attribute": ["Brand"], "value": ["x"], "extra": [1]})
    pq.write_table(odd, io.join(folder, f"{chunk_key('00', 0)}.parquet"))  # sorts first: its group's schema
    for _ in range(2):
        assert cli.main(["compact", output, "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert "has another schema" in err and f"left {output} readable" in err
        assert "stopped compaction left" not in err  # nothing was left to finish
        compact.check_readable(output)
        assert not io.exists(io.join(output, compact.JOURNAL))


def test_a_killed_compactions_leftovers_go(finished, tmp_path):
    """Finding 9: a journal entry's temporary file, and the record (and ``.taken``) of a killed
    compaction the next one waited out; a killed extract's record stays (its report counts it)."""
    output = copy_of(finished, tmp_path)
    io.write_bytes(io.join(output, compact.JOURNAL, f"{io.TEMPORARY_PREFIX}x.json-0123"), b"{")
    stale = time.time() - 3600
    for name, command in (("001-other-host-5", attempts.COMPACT), ("002-other-host-6", attempts.EXTRACT)):
        attempts.save(output, attempts.Attempt(name, stale, stale, "cpu", 0, 0.0, command=command))
    compact.compact(CompactConfig(output))
    assert not os.path.exists(os.path.join(output, compact.JOURNAL))
    left = {u.rsplit("/", 1)[-1] for u in io.list_files(io.join(output, attempts.DIRECTORY))}
    assert "001-other-host-5.json" not in left and "001-other-host-5.taken" not in left
    assert {"002-other-host-6.json", "002-other-host-6.taken"} <= left
