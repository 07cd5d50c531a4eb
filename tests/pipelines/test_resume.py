"""A driver killed at any point and started again with the same arguments: each product exactly once,
and chunks committed before the kill are not redone."""

import signal
import time

import pytest

from pipelines import attempts, io

from .helpers import (
    WAIT_SECONDS,
    catalog,
    check_exactly_once,
    commits,
    extract_args,
    jsonl,
    start_extract,
    upload,
    wait_for,
)

WORKER_TITLES = ("MapBatches(", "map_shards", "map_manifests", "reduce_interval")  # pipeline, id index
# Ray Data 2.60 reserves cluster resources per execution in a detached coordinator; a killed
# driver's reservation lingers until it expires (180 s by default), starving the next run. The
# killed drivers here use a short expiry so the session's later tests are not slowed down.
DRIVER_ENV = {"RAY_DATA_AUTOSCALING_REQUEST_EXPIRE_TIME_S": "15"}


def worker_pids(cluster) -> set[int]:
    return {process.pid for title in WORKER_TITLES for process in cluster.workers(title)}


@pytest.mark.slow  # ~50 s, four drivers; the default run resumes after Ctrl-C and SIGTERM (tests/jobs/test_extract_cli.py)
def test_driver_killed_at_any_point_resumes_exactly_once(ray_cluster, s3_server):
    bucket = s3_server.make_bucket("kill")
    records, valid = catalog(300)
    upload(s3_server, bucket, "in/a.jsonl", jsonl(records[:180]))
    upload(s3_server, bucket, "in/b.jsonl", jsonl(records[180:]))
    output = f"s3://{bucket}/out"
    argv = extract_args(f"s3://{bucket}/in", output, "--chunk-rows", 10,
                        "--dry-run-seconds-per-prompt", 0.02)
    kept = {}
    for kill_after_commits in (0, 4, 15):
        # workers left by earlier tests' drivers are not this driver's: wait only for those it started
        earlier = worker_pids(ray_cluster)
        driver = start_extract(argv, ray_cluster.address, DRIVER_ENV)
        if kill_after_commits == 0:
            time.sleep(3)  # killed while starting up or in its first chunks
        else:
            wait_for(lambda: len(commits(output)) >= kill_after_commits or driver.poll() is not None, "commits")
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        wait_for(lambda: not worker_pids(ray_cluster) - earlier, "the killed driver's workers to exit")
        committed = {uri: io.read_json(uri)["committed_at"] for uri in commits(output)}
        assert all(kept[uri] == committed[uri] for uri in kept)  # committed chunks are never redone
        kept = committed
    driver = start_extract(argv, ray_cluster.address)
    log = driver.communicate(timeout=WAIT_SECONDS)[0].decode()
    assert driver.returncode == 0, log[-3000:]
    result = check_exactly_once(output, records, valid)
    assert result["resumed"] and result["this_run"]["chunks"] < result["chunks"]
    # the report describes the whole job: the attempts killed after commits count too
    records = attempts.load_all(output)
    assert result["attempts"] == len(records) >= 3
    assert result["wall_seconds"] == pytest.approx(sum(a.wall_seconds for a in records), abs=0.01)
    assert result["wall_seconds"] > result["this_run"]["wall_seconds"]
    assert result["usd"] == pytest.approx(sum(a.usd for a in records), abs=1e-6)
    assert all(io.read_json(uri)["committed_at"] == kept[uri] for uri in kept)


def test_a_manifest_of_another_run_is_refused_not_counted(tmp_path):
    """A job that went on writing after `--overwrite` deleted its output leaves manifests of its own
    run: a resume must not count (or skip) their chunks as this run's (helper-27, session 51)."""
    import pyarrow as pa

    from pipelines import commit

    ours, theirs = commit.commit_uri(str(tmp_path), "s", 0), commit.commit_uri(str(tmp_path), "s", 1)
    for uri, run_id in ((ours, "run-a"), (theirs, "run-b")):
        io.write_json(uri, {"chunk": uri, "run_id": run_id, "committed_at": 0, "stats": {"rows_in": 1},
                            "owned_ids": [], "rejected_ids": []})
    assert commit.committed_stats(pa.table({"uri": [ours]}), run_id="run-a").num_rows == 1
    with pytest.raises(ValueError, match="was committed by run run-b, not run-a, the run this output holds"):
        commit.committed_stats(pa.table({"uri": [ours, theirs]}), run_id="run-a")


def test_an_input_rewritten_under_committed_chunks_is_refused_and_a_copy_is_not(ray_cluster, tmp_path, capsys):
    """An input rewritten in place at the same size (one row new at the top, the last one gone) kept
    its shard ids, so a resume took the committed chunks as done and redid the others on shifted
    rows: one product twice, one in neither folder (helper-27, session 51). The job now keeps each
    chunk's digest in the id index, and a resume reads every chunk again, committed ones too, and
    compares."""
    import os
    import shutil

    from .helpers import report, run_extract, sample_records

    records = sample_records()
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records))
    output = tmp_path / "out"
    argv = extract_args(source, output, "--chunk-rows", 10, "--group-chunks", 1)
    assert run_extract(argv) == 0
    manifests = sorted(commits(str(output)))
    assert len(manifests) == 4

    def crash():  # as if the job had been killed after its first two chunks
        for uri in manifests[2:] + [io.join(str(output), "_report.json")]:
            io.delete_if_exists(uri)
        for uri in io.list_files(io.join(str(output), "_commits")):
            if "/_chunks-" in uri:
                io.delete_if_exists(uri)

    crash()
    shutil.copyfile(source, tmp_path / "copy.jsonl")  # a copy: the same rows, another modification time
    os.replace(tmp_path / "copy.jsonl", source)
    assert run_extract(argv) == 0 and report(str(output))["products_out"] == len(records)

    manifests = sorted(commits(str(output)))
    crash()
    lines = source.read_bytes().splitlines(keepends=True)
    new = dict(records[0], product_id="NEW-0001", title="x")
    padding = sum(map(len, lines)) - sum(map(len, lines[:-1])) - len(jsonl([new]))
    source.write_bytes(jsonl([dict(new, title="x" + " " * padding)]) + b"".join(lines[:-1]))  # the same size
    assert len(source.read_bytes()) == sum(map(len, lines))
    assert run_extract(argv) == 1
    err = capsys.readouterr().err
    assert "the input changed under the job" in err and "use a new --output, or --overwrite to start the job over" in err
    assert "run the same command again" not in err  # it would fail alike

    # killed after its id index, before any commit: no manifest to compare, but the index keeps each
    # chunk's digest (its verdicts go by row position: a row now elsewhere would take another's)
    for uri in commits(str(output)):
        io.delete_if_exists(uri)
    assert run_extract(argv) == 1
    assert "are not those the id index read when the job began" in capsys.readouterr().err


def test_an_unfinished_job_whose_input_is_now_empty_is_refused_not_finished(ray_cluster, tmp_path, capsys):
    """An input emptied under an unfinished job made its resume a finished job of 0 products (the
    empty-input shortcut wrote `_report.json`), and later `--skip-existing` runs skipped the products
    it never wrote (helper-50, session 56: 300 lost). It is now refused as a changed input."""
    from .helpers import run_extract, sample_records

    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(sample_records()))
    output = tmp_path / "out"
    argv = extract_args(source, output, "--chunk-rows", 10, "--group-chunks", 1)
    assert run_extract(argv) == 0
    for uri in sorted(commits(str(output)))[2:] + [io.join(str(output), "_report.json")]:
        io.delete_if_exists(uri)  # as if killed after two chunks
    source.write_bytes(b"")
    assert run_extract(argv) == 2
    assert "holds no rows now, but the unfinished job in --output" in capsys.readouterr().err
    assert not io.exists(io.join(str(output), "_report.json"))
