"""The id index on a real local Ray: its verdicts equal the reference rule over the whole input, with
tasks cut small; a resumed run reuses it and keeps every owner; stale or foreign state is refused."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipelines import dedup, io, reader
from pipelines.idindex import INDEX_DIR, MARKER, IndexConfig, build_index, group_bytes, map_groups, shard_verdicts
from pipelines.prepare import PrepareConfig
from pipelines.reader import ReadConfig
from pipelines.schema import ValidationConfig, parse_schema
from pipelines.stacking import StackingConfig

from .helpers import check_exactly_once, commits, extract_args, read_attributes, read_rejected, run_extract

SCHEMA = {"Tea": ["Brand"], "Shoes": ["Color"]}


def _lines(rng: random.Random, n: int, pool: int) -> list[str]:
    lines = []
    for _ in range(n):
        kind = rng.random()
        record = {"product_id": f"id-{rng.randrange(pool)}", "category": rng.choice(["Tea", "Shoes"]), "title": "t"}
        if kind < 0.1:
            record["category"] = "Boats"  # invalid: owns nothing, still has an id
        elif kind < 0.15:
            record.pop("product_id")
        elif kind < 0.2:
            lines.append('{"product_id": "id-1", broken')
            continue
        lines.append(json.dumps(record))
    return lines


def _prepare(uri: str, output: str) -> PrepareConfig:
    return PrepareConfig(ReadConfig(uri, chunk_rows=7), ValidationConfig(), StackingConfig(), parse_schema(SCHEMA),
                         output)


def _reference(shards: list[reader.Shard], prepare: PrepareConfig, existing: set[str]) -> dict:
    rows = []
    for ordinal, shard in enumerate(shards):
        for _, records in reader.iter_chunks(shard, prepare.read):
            table = dedup.id_rows(ordinal, records, prepare.schema, prepare.validation).to_pylist()
            rows += [(r["shard"], r["row"], r["product_id"], r["valid"]) for r in table]
    return dedup.decide_reference(rows, existing)


def _found(shards, index) -> dict:
    found = {}
    for ordinal, shard_index in enumerate(index):
        verdicts = shard_verdicts(shard_index)
        found.update({(ordinal, int(row)): dedup.Verdict(verdicts[row]) for row in np.flatnonzero(verdicts)})
    return found


@pytest.mark.parametrize("task_cpus", [1.0, 0.5, 4.0])
def test_index_tasks_in_flight_stay_within_the_clusters_cpus(ray_cluster, task_cpus):
    """No more index tasks wait than the cluster's CPUs hold (an autoscaler would start nodes for the
    rest: GPU nodes, on a cluster of GPU nodes only), one at least; results in submission order."""
    import time

    import ray

    from pipelines.idindex import run_bounded

    @ray.remote
    class Gauge:
        def __init__(self):
            self.now = self.peak = 0

        def enter(self):
            self.now += 1
            self.peak = max(self.peak, self.now)

        def leave(self):
            self.now -= 1

        def highest(self):
            return self.peak

    @ray.remote(num_cpus=0)
    def task(i, gauge):
        ray.get(gauge.enter.remote())
        time.sleep(0.3)
        ray.get(gauge.leave.remote())
        return i * i

    gauge = Gauge.options(num_cpus=0).remote()
    submitted = []

    def submit(i):
        submitted.append(i)
        return task.remote(i, gauge)

    assert run_bounded(submit, 7, task_cpus) == [i * i for i in range(7)] and submitted == list(range(7))
    cpus = ray.cluster_resources()["CPU"]
    allowed = max(1, int(cpus / task_cpus))
    assert ray.get(gauge.highest.remote()) == min(allowed, 7)  # as many as allowed ran together, no more
    assert run_bounded(submit, 0, task_cpus) == []


def test_map_groups_are_consecutive_shards_of_about_map_bytes():
    shards = [reader.Shard(f"s{i}", f"f{i}", "jsonl", 0, size) for i, size in enumerate((5, 5, 5, 20, 1, 0, 3))]
    groups = map_groups(shards, 10)
    assert [[o for o, _ in g] for g in groups] == [[0, 1], [2, 3], [4, 5, 6]]
    assert [s for g in groups for _, s in g] == shards
    assert [[o for o, _ in g] for g in map_groups(shards, 1)] == [[i] for i in range(7)]
    assert group_bytes(shards, 10, cpus=2) == 10 and group_bytes(shards, 10, cpus=8) == 5  # 40 bytes: 8 CPUs' worth
    assert group_bytes(shards, 1 << 30, cpus=1) == 40 and group_bytes(shards, 10, cpus=0.5) == 10
    with pytest.raises(ValueError, match="map_bytes"):
        IndexConfig(map_bytes=0)


@pytest.mark.parametrize("map_bytes", [1, pytest.param(1 << 30, marks=pytest.mark.slow)],  # 20 s each
                         ids=["a-task-per-shard", "a-task-per-cpu"])
def test_verdicts_equal_the_reference_with_small_tasks(ray_cluster, tmp_path, map_bytes):
    rng = random.Random(7)
    source = tmp_path / "in"
    source.mkdir()
    for name in ("a", "b", "c"):
        (source / f"{name}.jsonl").write_text("\n".join(_lines(rng, 150, 60)) + "\n")
    prefix = tmp_path / "earlier"

    done_input = tmp_path / "done-in.jsonl"  # an earlier, finished output: its index's id files
    done_input.write_text("\n".join(_lines(rng, 30, 200)) + "\n")
    done = prefix / "dt=1"
    done_prepare = _prepare(str(done_input), str(done))
    done_shards = reader.plan_shards(done_prepare.read)
    build_index(done_shards, done_prepare, str(done), None, IndexConfig(ids_per_partition=4))
    io.write_json(str(done / "_job.json"), {})
    io.write_json(str(done / "_report.json"), {})
    done_ids = {product_id for product_id in _ids_of(done_shards, done_prepare)}

    partial = prefix / "dt=2"  # an unfinished earlier output: its committed manifests
    io.write_json(str(partial / "_job.json"), {})
    io.write_json(str(partial / "_commits" / "abc" / "000000.json"), {"owned_ids": ["id-3"], "rejected_ids": ["id-4"]})
    io.write_json(str(partial / "_commits" / "abc" / "000001.json"), {"owned_ids": ["id-5"], "rejected_ids": []})

    output = prefix / "dt=3"  # this run's own output lies under the prefix: not an earlier output
    io.write_json(str(output / "_job.json"), {})
    prepare = _prepare(str(source), str(output))
    shards = reader.plan_shards(prepare.read)
    index = build_index(shards, prepare, str(output), str(prefix), IndexConfig(ids_per_partition=25, map_bytes=map_bytes))

    meta = io.read_json(str(output / INDEX_DIR / MARKER))
    assert meta["earlier_outputs"] == [str(done), str(partial)]
    assert len(meta["ids"]) > 1  # many intervals
    expected = _reference(shards, prepare, done_ids | {"id-3", "id-4", "id-5"})
    assert {v for v in expected.values()} == {dedup.Verdict.DUPLICATE, dedup.Verdict.EXISTING}
    assert _found(shards, index) == expected
    assert meta["duplicates"] == sum(v == dedup.Verdict.DUPLICATE for v in expected.values())
    assert not list((output / INDEX_DIR / meta["build"] / "map").glob("*"))  # map runs deleted
    assert [s["rows"] for s in meta["shards"]] == [150, 150, 150]  # each shard's own count, grouped or not
    assert all(len(s["verdicts"]) <= 1 for s in meta["shards"])  # one range each, however many intervals
    assert sum(len(s["verdicts"]) for s in meta["shards"]) >= 2 and len(meta["ids"]) >= 3
    build = output / INDEX_DIR / meta["build"]
    assert not list((build / "intervals").glob("*")) and list((build / "verdicts").glob("*"))  # gathered, then deleted


def _ids_of(shards, prepare) -> list[str]:
    """The ids an output of these shards holds: those of its valid rows."""
    return [r["product_id"] for ordinal, shard in enumerate(shards) for _, records in reader.iter_chunks(shard, prepare.read)
            for r in dedup.id_rows(ordinal, records, prepare.schema, prepare.validation).to_pylist() if r["valid"]]


@pytest.fixture
def dup_job(ray_cluster, tmp_path):
    """Two files; product "dup" first in a.jsonl row 0, again as the last row of b.jsonl."""
    source = tmp_path / "in"
    source.mkdir()
    a = [{"product_id": "dup", "category": "Tea", "title": "first"}]
    a += [{"product_id": f"a{i}", "category": "Tea", "title": f"a {i}"} for i in range(9)]
    b = [{"product_id": f"b{i}", "category": "Shoes", "title": f"b {i}"} for i in range(9)]
    b += [{"product_id": "dup", "category": "Shoes", "title": "later"}]
    (source / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in a))
    (source / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in b))
    output = tmp_path / "out"
    argv = extract_args(source, output, "--chunk-rows", 4)
    assert run_extract(argv) == 0
    return {"argv": argv, "output": str(output), "records": a + b, "valid": {r["product_id"] for r in a + b}}


def _manifest_with(output: str, key: str, product_id: str) -> str:
    (uri,) = [u for u in commits(output) if product_id in io.read_json(u)[key]]
    return uri


def _check_dup_owned_by_first(job):
    rows = read_attributes(job["output"]).to_pylist()
    assert {r["category"] for r in rows if r["product_id"] == "dup"} == {"Tea"}  # a.jsonl's row owns it
    (rejected,) = read_rejected(job["output"])
    assert json.loads(rejected["record"])["title"] == "later" and rejected["reason"] == "duplicate product_id"
    check_exactly_once(job["output"], job["records"], job["valid"])


@pytest.mark.parametrize("lost", ["owner", "duplicate"])
def test_a_duplicate_keeps_its_owner_across_a_resume(dup_job, lost, recwarn):
    """A crash lost the commit of the owner's chunk, or of the duplicate's: the resumed run redoes it
    with the verdicts of the first attempt, read from the index (not rebuilt). One chunk to do: no
    pool larger than its inputs (Ray Data warns of one)."""
    _check_dup_owned_by_first(dup_job)
    index_before = io.read_json(io.join(dup_job["output"], INDEX_DIR, MARKER))
    key = "owned_ids" if lost == "owner" else "rejected_ids"
    io.delete_if_exists(_manifest_with(dup_job["output"], key, "dup"))
    io.delete_if_exists(io.join(dup_job["output"], "_report.json"))
    stale = io.join(dup_job["output"], INDEX_DIR, "0123456789ab", "map", "run.parquet")  # a killed task's late write
    io.write_bytes(stale, b"late")
    assert run_extract(dup_job["argv"]) == 0
    result = io.read_json(io.join(dup_job["output"], "_report.json"))
    assert result["resumed"] and result["this_run"]["chunks"] == 1
    assert _builds(dup_job["output"]) == [index_before["build"]]
    assert not [w for w in recwarn if "maximum number of concurrent tasks" in str(w.message)]
    assert io.read_json(io.join(dup_job["output"], INDEX_DIR, MARKER)) == index_before
    _check_dup_owned_by_first(dup_job)


def test_an_unfinished_index_is_built_again(dup_job):
    """Killed while building the index (no chunk committed yet): the next attempt builds a new one."""
    output = dup_job["output"]
    old = io.read_json(io.join(output, INDEX_DIR, MARKER))["build"]
    for name in ("_commits", "attributes", "rejected"):
        shutil.rmtree(io.join(output, name))
    for name in ("_report.json", "_report.md", f"{INDEX_DIR}/{MARKER}"):
        io.delete_if_exists(io.join(output, name))
    io.write_bytes(io.join(output, INDEX_DIR, "0123456789ab", "map", "run.parquet"), b"killed earlier, mid-map")
    assert run_extract(dup_job["argv"]) == 0
    new = io.read_json(io.join(output, INDEX_DIR, MARKER))["build"]
    assert new != old
    assert _builds(output) == [new]  # the unfinished builds' folders are deleted once the new one is live
    _check_dup_owned_by_first(dup_job)


def _builds(output: str) -> list[str]:
    return sorted(p.name for p in (Path(output) / INDEX_DIR).iterdir() if p.is_dir())


def test_committed_chunks_without_an_index_are_refused(dup_job, capsys):
    shutil.rmtree(io.join(dup_job["output"], INDEX_DIR))
    io.delete_if_exists(io.join(dup_job["output"], "_report.json"))
    assert run_extract(dup_job["argv"]) == 2
    assert "no id index" in capsys.readouterr().err


def test_an_input_changed_since_the_index_is_refused(dup_job, tmp_path, capsys):
    with open(tmp_path / "in" / "b.jsonl", "a") as out:
        out.write(json.dumps({"product_id": "new", "category": "Tea", "title": "new"}) + "\n")
    assert run_extract(dup_job["argv"]) == 2
    err = capsys.readouterr().err
    assert f"--input changed since the job in {dup_job['output']} started: {tmp_path / 'in' / 'b.jsonl'} added" in err
    assert "use a new --output, or --overwrite to start the job over" in err


def test_an_input_changed_in_place_to_the_same_size_is_named_in_a_warning(dup_job, tmp_path, capsys):
    """A file rewritten to the same size (one id for another) keeps its shards; its modification time
    is the sign, and the job says so (a copy or a touch changes it too: a warning, not a refusal)."""
    path = tmp_path / "in" / "a.jsonl"
    text = path.read_text()
    capsys.readouterr()
    assert run_extract(dup_job["argv"]) == 0  # finished, untouched: nothing to say
    assert "modified since this job started" not in capsys.readouterr().err
    path.write_text(text.replace('"a3"', '"z3"'))  # another id, the same length
    assert len(path.read_text()) == len(text)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a coarse clock may not tick
    assert run_extract(dup_job["argv"]) == 0
    err = capsys.readouterr().err
    assert "hpd extract: warning: files of --input were modified since this job started" in err
    assert "already complete" in err
