"""The id index: every row's dedup / skip-existing verdict, decided once per output, in bounded memory.

Before the pipeline starts, the job decides for every input row whether an earlier row owns its
product id (a duplicate) or an earlier output already holds it (--skip-existing); the rule is in
pipelines/dedup.py. It takes one map and one reduce step over hash partitions of the ids
(pipelines/idruns.py), in Ray tasks (pipelines/idtasks.py), with every file under the output:

```
shards ──map_shards, a task per group of shards──▶ runs of (id, hash, shard, row, valid) by fine partition  _dedup/<build>/map/
earlier outputs: unfinished ones' manifests ──map_manifests──▶ runs of ids by fine partition          _dedup/<build>/map/
runs + finished earlier outputs' id files (slotted alike) ──reduce_interval, a task per hash interval──▶
        verdicts of the rows that have one (duplicates, skipped), grouped by shard                 _dedup/<build>/intervals/
        the ids this output holds, by fine partition, for later --skip-existing runs                _dedup/<build>/ids/
intervals' verdicts ──gather_verdicts, a task per map group that has any──▶ one file per group, by shard  _dedup/<build>/verdicts/
_dedup/_index.json (written last): per shard its rows and the byte range of its verdicts; the id files:
        fine partitions [lo, hi) with their counts and byte offsets
```

The driver adds up the map tasks' ids per fine partition and cuts the hash space into intervals of
at most ``ids_per_partition`` ids (input and earlier outputs together). The prepare stage then reads
only its own shard's verdicts (normally none).

Why memory is bounded. A map task holds about ``ids_per_partition`` id rows at most (it writes a run
and starts the next); a reduce task one interval's ids, from this input and earlier outputs (at most
``ids_per_partition``: every source is read by byte range, exactly the interval); a prepare task one
verdict byte per row of its shard. The driver holds counts and byte offsets (64 KB per run or id
file), never ids; a map task reads a group of shards (``map_bytes`` of input), so there is about one
run per ``ids_per_partition`` ids or per ``map_bytes`` of input, whichever is more, however many
files the input has (one run per file would be, for 30,000 files, about 1.9 GB of offsets on the
driver, at the 64.5 KiB a run measured, and 30,000 byte ranges for every reduce task to read). A bigger catalog means more runs, intervals and
tasks, not bigger ones (up to ``FINE_PARTITIONS`` x ``ids_per_partition`` ids, 4 billion at the
default; past that, a single fine partition holds more than ``ids_per_partition``).

Resume. ``_index.json`` is written after every file it names and before any chunk is processed. A
resumed run reads it and no ids; an index that was not finished is built again (no chunk can have
been committed), into a new ``<build>`` directory so that a killed attempt's late writes cannot mix in.
Once ``_index.json`` names a build, the other ``<build>`` directories (killed builds', each up to a copy
of the input's ids) are deleted, by the attempt that holds the output's lease (pipelines/attempts.py:
one at a time), and again by every resumed attempt (a killed attempt's tasks may have written late).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow.fs as pafs
import ray

from pipelines import attempts, commit, dedup, io, reader
from pipelines.idruns import FINE_BITS, FINE_PARTITIONS, read_slots
from pipelines.idtasks import GATHER_VERDICTS, MAP_MANIFESTS, MAP_SHARDS, REDUCE_INTERVAL, Run, id_run, ranges

if TYPE_CHECKING:  # prepare imports this module
    from pipelines.prepare import PrepareConfig

log = logging.getLogger("hpd.extract")

INDEX_DIR = "_dedup"
MARKER = "_index.json"
MANIFESTS_PER_TASK = 256
START_OVER = commit.START_OVER


class InputChangedError(RuntimeError):
    """The input's rows are not those the id index read: resuming cannot help (``hpd extract`` says
    so instead of its advice to run the same command again)."""


@dataclass(frozen=True)
class IndexConfig:
    """ids_per_partition: the most product ids one index task holds (a map run, a reduce interval).
    map_bytes: the most input bytes one map task reads (consecutive shards, ``map_groups``; less
        where the cluster has more CPUs than the input has map_bytes): a catalog of many small
        files then has about as many map runs as it has input bytes / map_bytes or ids /
        ids_per_partition, not one per file, and every reduce task reads that many ranges.
    cpus: CPUs each index task reserves (they are CPU-bound: parse and validate every row)."""

    ids_per_partition: int = 1_000_000
    map_bytes: int = 256 << 20
    cpus: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.ids_per_partition, int) or self.ids_per_partition < 1:
            raise ValueError(f"ids_per_partition must be a positive int, got {self.ids_per_partition!r}")
        if not isinstance(self.map_bytes, int) or self.map_bytes < 1:
            raise ValueError(f"map_bytes must be a positive int, got {self.map_bytes!r}")
        if self.cpus <= 0:
            raise ValueError(f"index cpus must be > 0, got {self.cpus}")


@dataclass(frozen=True)
class ShardIndex:
    """What the prepare stage needs of the index for one shard."""

    rows: int  # rows the shard had when the index was built
    verdicts: tuple[tuple[str, int, int], ...]  # (slotted file, start, end): this shard's verdict rows
    digests: tuple[str, ...] = ()  # each chunk's reader.chunk_digest then (none in indexes before 2026-11-29)


@dataclass(frozen=True)
class EarlierIds:
    """Where the product ids of earlier outputs are (--skip-existing)."""

    outputs: tuple[str, ...] = ()
    id_runs: tuple[Run, ...] = ()  # finished outputs with an index: their id files
    manifests: tuple[str, ...] = ()  # the others (unfinished, or from older versions): committed manifests


def output_roots(prefix: str) -> list[str]:
    """Outputs under ``prefix`` (itself included): directories that hold a ``_job.json``. Listed one
    level at a time, never inside an output, so the cost does not grow with what the outputs hold."""
    fs, path = io.filesystem(prefix)
    roots, pending = [], [path]
    while pending:
        directory = pending.pop()
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        if any(info.base_name == "_job.json" for info in infos):
            roots.append(io.to_uri(fs, directory))
            continue
        pending += [i.path for i in infos if i.type == pafs.FileType.Directory and not i.base_name.startswith(("_", "."))]
    return sorted(roots)


def earlier_outputs(prefix: str, exclude: str) -> list[str]:
    """``output_roots`` of ``prefix`` except ``exclude`` (this run's own, which resume covers) and
    any output inside it."""
    own = exclude.rstrip("/")
    return [root for root in output_roots(prefix) if root != own and not root.startswith(own + "/")]


def find_earlier(prefix: str, exclude: str) -> EarlierIds:
    """The outputs under ``prefix`` except ``exclude`` (``earlier_outputs``) and where their ids
    are: a finished output's index, or the committed manifests of any other."""
    own = exclude.rstrip("/")
    outputs, id_runs, manifests = [], [], []
    for root in earlier_outputs(prefix, exclude):
        outputs.append(root)
        marker = io.join(root, INDEX_DIR, MARKER)
        index = io.read_json(marker) if io.exists(io.join(root, "_report.json")) and io.exists(marker) else {}
        if index.get("fine_bits") == FINE_BITS:
            build = io.join(root, INDEX_DIR, index["build"])
            id_runs += [id_run(io.join(build, f["uri"]), f["lo"], f["hi"], f["counts"], f["offsets"]) for f in index["ids"]]
        else:
            if not io.exists(io.join(root, "_report.json")):
                close_unfinished(root, own)
            manifests += commit.scan(root).manifests
    if outputs:
        log.info("--skip-existing: %d earlier outputs under %s (%d id files, %d manifests)", len(outputs), prefix,
                 len(id_runs), len(manifests))
    else:  # e.g. the first nightly run: nothing done yet
        log.info("--skip-existing %s: no earlier output there; nothing to skip", prefix)  # hpd extract warns before
    return EarlierIds(tuple(outputs), tuple(id_runs), tuple(manifests))


def close_unfinished(root: str, own: str) -> None:
    """Close the unfinished job in ``root``, whose committed products this job (``own``) skips and
    whose remaining ones it extracts: resuming it afterwards would write those twice
    (``commit.close``). Refused (``ValueError``, the mark taken back) while an attempt works on it:
    it would commit more meanwhile. Marked first and looked second, as its attempts record first
    and look second (``build.begin_attempt``), so of the two at least one sees the other."""
    wrote = commit.close(root, own)
    if others := attempts.running(root, None, attempts.HEARTBEAT_SECONDS):
        if wrote:
            commit.reopen(root)
        raise ValueError(f"--skip-existing: the unfinished job in {root} is being extracted now (attempt "
                         f"{others[-1].name}); wait for it to end, then run this again")
    if wrote:
        log.warning("--skip-existing: the job in %s is unfinished: its committed products are skipped, the rest are "
                    "extracted here, and it is closed (a resume of it is refused: it would write them twice)", root)


def group_bytes(shards: list[reader.Shard], map_bytes: int, cpus: float) -> int:
    """Input bytes per map task: ``map_bytes``, or less where that would leave CPUs idle (a 1 GB
    input on 64 CPUs: 64 tasks of 16 MB, not 4 of 256 MB)."""
    total = sum(max(shard.end - shard.start, 1) for shard in shards)
    return max(1, min(map_bytes, -(-total // max(1, int(cpus)))))


def map_groups(shards: list[reader.Shard], map_bytes: int) -> list[list[tuple[int, reader.Shard]]]:
    """Consecutive (ordinal, shard) pairs, a group closing once its shards hold ``map_bytes`` bytes
    or more: one map task each."""
    groups: list[list[tuple[int, reader.Shard]]] = []
    size = map_bytes
    for ordinal, shard in enumerate(shards):
        if size >= map_bytes:
            groups.append([])
            size = 0
        groups[-1].append((ordinal, shard))
        size += max(shard.end - shard.start, 1)
    return groups


def cut(counts: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive fine partitions [lo, hi) covering them all, each with at most ``limit`` ids (or one
    fine partition)."""
    intervals, lo, total = [], 0, 0
    for fine, count in enumerate(counts.tolist()):
        if total and total + count > limit:
            intervals.append((lo, fine))
            lo, total = fine, 0
        total += count
    intervals.append((lo, len(counts)))
    return intervals


def load_index(output_uri: str, shards: list[reader.Shard], committed: bool,
               fence: Callable[[], None] = lambda: None) -> list[ShardIndex] | None:
    """The output's finished index for these shards; None if there is none yet. ``fence`` raises if
    this attempt may no longer write there (checked before it deletes anything)."""
    directory = io.join(output_uri, INDEX_DIR)
    if not io.exists(io.join(directory, MARKER)):
        if committed:
            raise ValueError(f"{output_uri} has committed chunks but no id index ({INDEX_DIR}/{MARKER}): it was "
                             "written by an older version of hpd extract; use a new --output")
        return None
    index = io.read_json(io.join(directory, MARKER))
    if [s["shard_id"] for s in index["shards"]] != [s.shard_id for s in shards]:
        raise ValueError(f"--input changed since the job in {output_uri} started: {_changed_files(index, shards)}; "
                         f"resuming would mix two inputs: {START_OVER}")
    fence()
    delete_stale_builds(output_uri, index["build"])
    return _shard_indexes(index, io.join(directory, index["build"]))


def _changed_files(index: dict, shards: list[reader.Shard]) -> str:
    """The files whose shards are not those of the index (added or resized, or removed where the index
    names its shards' files: not before 2026-11-30), in words."""
    known, now = {s["shard_id"] for s in index["shards"]}, {s.shard_id for s in shards}
    files = sorted({s.uri for s in shards if s.shard_id not in known}
                   | {s["uri"] for s in index["shards"] if s["shard_id"] not in now and "uri" in s})
    if not files:
        return "a file was removed or the files were reordered"
    return f"{', '.join(files[:3])}{f' and {len(files) - 3} more' if len(files) > 3 else ''} added, removed or resized"


def delete_stale_builds(output_uri: str, live: str) -> None:
    """Delete every ``_dedup/<build>/`` but ``live`` (the one ``_index.json`` names): builds that killed
    attempts left unfinished. Only called by the attempt that holds the output's lease, so no other
    attempt builds an index there meanwhile."""
    fs, path = io.filesystem(io.join(output_uri, INDEX_DIR))
    for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and info.base_name != live:
            try:
                fs.delete_dir(info.path)
            except FileNotFoundError:
                pass


def _shard_indexes(index: dict, build: str) -> list[ShardIndex]:
    return [ShardIndex(s["rows"], tuple((io.join(build, uri), a, b) for uri, a, b in s["verdicts"]),
                       tuple(s.get("digests", ()))) for s in index["shards"]]


def run_bounded(submit: Callable[[int], ray.ObjectRef], count: int, task_cpus: float) -> list:
    """``ray.get`` of ``submit(0) ... submit(count - 1)``, in that order, with no more tasks in flight
    than the cluster's CPUs hold at ``task_cpus`` each (read again as tasks end, so nodes that join
    are used). Tasks waiting beyond that would make an autoscaler start nodes for them: on a cluster
    whose only worker type is a GPU node, GPU nodes, as many as its max_workers, to build the index."""
    results: list = [None] * count
    pending: dict = {}
    submitted = 0
    while submitted < count or pending:
        room = max(1, int(ray.cluster_resources().get("CPU", 0) / task_cpus)) - len(pending)
        for _ in range(min(max(room, 0), count - submitted)):
            pending[submit(submitted)] = submitted
            submitted += 1
        done, _ = ray.wait(list(pending), num_returns=1, timeout=5)  # and look again for CPUs that joined
        for ref in done:
            results[pending.pop(ref)] = ray.get(ref)
    return results


def build_index(
    shards: list[reader.Shard], prepare: PrepareConfig, output_uri: str, skip_existing: str | None, config: IndexConfig,
    fence: Callable[[], None] = lambda: None,
) -> list[ShardIndex]:
    """Map, cut, reduce; write ``_index.json`` (``fence`` first: it raises if this attempt may no
    longer write there); return what each shard needs."""
    started, name = time.time(), uuid.uuid4().hex[:12]
    build = io.join(output_uri, INDEX_DIR, name)
    earlier = find_earlier(skip_existing, output_uri) if skip_existing else EarlierIds()
    task = {"num_cpus": config.cpus, "retry_exceptions": True}  # e.g. S3 errors; the tasks' writes are idempotent
    limit = config.ids_per_partition
    settings = ray.put(prepare)  # one copy in the object store, not one per task (a schema can be megabytes)
    cpus = ray.cluster_resources().get("CPU", 1) / config.cpus  # index tasks that can run at once
    shard_groups = map_groups(shards, group_bytes(shards, config.map_bytes, cpus))
    mapped = run_bounded(lambda i: MAP_SHARDS.options(**task).remote(shard_groups[i], settings, build, limit),
                         len(shard_groups), config.cpus)
    rows, digests = [0] * len(shards), [[] for _ in shards]
    for result in mapped:
        for ordinal, count, chunk_digests in result["rows"]:
            rows[ordinal], digests[ordinal] = count, chunk_digests
    manifest_groups = [earlier.manifests[i : i + MANIFESTS_PER_TASK] for i in range(0, len(earlier.manifests), MANIFESTS_PER_TASK)]
    mapped_earlier = [run for runs in run_bounded(
        lambda i: MAP_MANIFESTS.options(**task).remote(i, manifest_groups[i], build, limit), len(manifest_groups),
        config.cpus) for run in runs]
    runs = [run for result in mapped for run in result["runs"]]
    earlier_runs = mapped_earlier + list(earlier.id_runs)
    log.info("id index: %d shards mapped by %d tasks into %d runs; %d runs of earlier outputs (%.1f s)", len(shards),
             len(shard_groups), len(runs), len(earlier_runs), time.time() - started)

    counts = sum((run.counts for run in runs + earlier_runs), np.zeros(FINE_PARTITIONS, np.int64))
    intervals = cut(counts, limit)
    starts = [group[0][0] for group in shard_groups]
    reduced = run_bounded(lambda n: REDUCE_INTERVAL.options(**task).remote(
        n, *intervals[n], ranges(runs, *intervals[n]), ranges(earlier_runs, *intervals[n]), len(shards), build, starts),
        len(intervals), config.cpus)

    # each map group's verdicts: one byte range of each interval's file that has any, gathered into one
    # file per group, so a shard's verdicts are one range (with --skip-existing on a mostly done
    # catalog every shard has some in every interval: 30,000 shards x 316 intervals of ranges before)
    parts: list[list[tuple[str, int, int]]] = [[] for _ in shard_groups]
    for result in reduced:
        if result["verdicts"] is not None:
            offsets = result["group_offsets"]
            for g in range(len(shard_groups)):
                if offsets[g + 1] > offsets[g]:
                    parts[g].append((io.join(build, result["verdicts"]), int(offsets[g]), int(offsets[g + 1])))
    wanted = [g for g in range(len(shard_groups)) if parts[g]]
    gathered = run_bounded(lambda i: GATHER_VERDICTS.options(**task).remote(
        wanted[i], starts[wanted[i]], len(shard_groups[wanted[i]]), parts[wanted[i]], build), len(wanted), config.cpus)
    verdicts = [[] for _ in shards]
    for g, result in zip(wanted, gathered):
        offsets = result["offsets"]
        for n in range(len(shard_groups[g])):
            if offsets[n + 1] > offsets[n]:
                verdicts[starts[g] + n].append((result["verdicts"], int(offsets[n]), int(offsets[n + 1])))
    index = {
        "build": name,
        "shards": [{"shard_id": s.shard_id, "uri": s.uri, "rows": n, "verdicts": v, "digests": d}
                   for s, n, v, d in zip(shards, rows, verdicts, digests)],
        "ids": [r["ids"] for r in reduced if r["ids"]],  # their slots [lo, hi): counts and byte offsets
        "fine_bits": FINE_BITS,
        "ids_per_partition": limit,
        "earlier_outputs": list(earlier.outputs),
        "duplicates": sum(r["duplicates"] for r in reduced),
        "existing": sum(r["existing"] for r in reduced),
        "seconds": round(time.time() - started, 3),
    }
    fence()  # an attempt that was paused while another took over publishes nor deletes any build
    io.write_json(io.join(output_uri, INDEX_DIR, MARKER), index)
    delete_stale_builds(output_uri, name)
    for uri in [run.uri for run in runs + mapped_earlier] + [io.join(build, r["verdicts"]) for r in reduced if r["verdicts"]]:
        io.delete_if_exists(uri)  # the maps' runs and the intervals' verdicts: all gathered
    log.info("id index: %d intervals, %d duplicates, %d rows already in earlier outputs (%.1f s)", len(intervals),
             index["duplicates"], index["existing"], index["seconds"])
    return _shard_indexes(index, build)


def ensure_index(
    shards: list[reader.Shard], prepare: PrepareConfig, output_uri: str, skip_existing: str | None,
    config: IndexConfig, committed: bool, fence: Callable[[], None] = lambda: None,
) -> list[ShardIndex]:
    """The finished index of this output (resume), or a new one; ``fence`` raises if this attempt may
    no longer write there."""
    index = load_index(output_uri, shards, committed, fence)
    return index if index is not None else build_index(shards, prepare, output_uri, skip_existing, config, fence)


def shard_verdicts(index: ShardIndex) -> np.ndarray:
    """One verdict per row of the shard (dedup.Verdict values), from its byte ranges of the verdict files."""
    status = np.zeros(index.rows, dtype=np.int8)
    for uri, start, end in index.verdicts:
        table = read_slots(uri, start, end, dedup.VERDICTS_SCHEMA)
        status[table["row"].to_numpy()] = table["verdict"].to_numpy()
    return status


def to_json(index: ShardIndex) -> str:
    """A shard's index as text, to travel with its shard through Ray Data."""
    return json.dumps({"rows": index.rows, "verdicts": index.verdicts, "digests": index.digests})


def from_json(text: str) -> ShardIndex:
    data = json.loads(text)
    return ShardIndex(data["rows"], tuple(tuple(v) for v in data["verdicts"]), tuple(data.get("digests", ())))
