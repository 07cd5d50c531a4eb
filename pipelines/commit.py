"""Exactly-once output: the layout under ``--output``, chunk writes, commit markers, resume scans.

```
attributes/category=<path-safe>/<chunk>.parquet   one row per (product, attribute); the category is
                                                  the directory only (Hive convention), not a column
rejected/<chunk>.parquet                          original record as JSON, reason, stage, run_id
_commits/<shard>/<index>.json                     chunk manifest: counters + product ids; the commit
_commits/<shard>/_chunks-<n>.json                 the shard was read to the end and has n chunks
_job.json                                         run id and arguments of the job writing here
_dedup/                                           the id index: dedup and skip verdicts (pipelines/idindex.py)
_attempts/<attempt>.json (and .taken)             each attempt's time, and the output's lease (pipelines/attempts.py)
_closed.json                                      a later --skip-existing job took the unfinished rest over (``close``)
_report.json, _report.md                          written last, when every chunk is committed
```

A chunk's files are named by its key, so writing a chunk again (Ray retry, resumed run) replaces
them; its manifest is written last and is the commit. A resumed run skips committed chunks and
redoes the others from scratch; a file of an uncommitted chunk that the new attempt does not produce
(e.g. a product now rejected as a duplicate) is deleted, so no stale row survives. Readers should
trust an output once ``_report.json`` exists.

Once it does, `hpd compact` may pack each folder's small files into few (pipelines/compact.py): a
new file holds whole chunk files, in name order, and is named after its first one's key
(``<key>.compacted-<hex>.parquet``), so a file's name is a chunk key only until then.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pipelines import accounting, attempts, io
from pipelines.compact import DONE as COMPACTED, MARKER as COMPACTING
from pipelines.schema import PARTITION_COLUMN, partition_value

ATTRIBUTES_SCHEMA = pa.schema(
    [
        ("product_id", pa.string()),
        (PARTITION_COLUMN, pa.string()),
        ("attribute", pa.string()),
        ("value", pa.string()),
        ("truncated", pa.bool_()),  # the value hit K_max, or the product text was cut to max_text_chars
        ("decoder", pa.string()),
        ("model", pa.string()),
        ("run_id", pa.string()),
    ]
)
# --confidence (DecodeConfig.confidence): the value's probability under the model, after run_id
CONFIDENCE_FIELD = pa.field("confidence", pa.float32())


def attributes_schema(confidence: bool) -> pa.Schema:
    """The attribute rows' schema: ATTRIBUTES_SCHEMA, and the confidence column when asked for."""
    return ATTRIBUTES_SCHEMA.append(CONFIDENCE_FIELD) if confidence else ATTRIBUTES_SCHEMA


REJECTED_SCHEMA = pa.schema(
    [("record", pa.string()), ("reason", pa.string()), ("stage", pa.string()), ("run_id", pa.string())]
)
INDEX_DIGITS = 6
WRITE_THREADS = 16  # a chunk's files written at once (write_chunk)
_COMMIT_NAME = re.compile(r"/_commits/([0-9a-f]+)/(\d+)\.json$")
_SHARD_NAME = re.compile(r"/_commits/([0-9a-f]+)/_chunks-(\d+)\.json$")


@dataclass(frozen=True)
class OutputConfig:
    uri: str
    run_id: str
    attempt: str | None = None  # the attempt writing (its lease is checked before each chunk's writes); None: unchecked

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str) or not self.uri:
            raise ValueError("output URI must be a non-empty string")
        if not self.run_id:
            raise ValueError("run_id must be set")


def chunk_key(shard_id: str, index: int) -> str:
    return f"{shard_id}-{index:0{INDEX_DIGITS}d}"


def attributes_uri(output: str, category: str, key: str) -> str:
    return io.join(output, "attributes", f"{PARTITION_COLUMN}={partition_value(category)}", f"{key}.parquet")


def rejected_uri(output: str, key: str) -> str:
    return io.join(output, "rejected", f"{key}.parquet")


def commit_uri(output: str, shard_id: str, index: int) -> str:
    return io.join(output, "_commits", shard_id, f"{index:0{INDEX_DIGITS}d}.json")


def mark_shard_read(output: str, shard_id: str, chunks: int) -> None:
    io.write_json(io.join(output, "_commits", shard_id, f"_chunks-{chunks}.json"), {"chunks": chunks})


def existing_job(output: str) -> tuple[dict | None, bool]:
    """(the ``_job.json`` of the job writing to ``output`` or None, whether ``output`` holds any file)."""
    marker = io.join(output, "_job.json")
    if io.exists(marker):
        return io.read_json(marker), True
    return None, bool(io.list_files(output))


def leftovers_only(output: str) -> bool:
    """``output`` holds files, and only what a deletion of a job leaves when it is killed after the
    claim went (attempt records, ``_attempts/``, and files on their way, ``.tmp-*``): no job, and
    nothing of one but its lease; deleted under a lease by the next run (``discard``)."""
    files = io.list_files(output)
    prefix = io.join(output, attempts.DIRECTORY) + "/"
    return bool(files) and all(uri.startswith(prefix) or uri.rsplit("/", 1)[-1].startswith(io.TEMPORARY_PREFIX) for uri in files)


def differences(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, old value, new value) for every argument that differs, nested dicts flattened."""
    found = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append((f"{prefix}{key}", a, b))
    return found


def claim_output(output: str, run_id: str, arguments: dict) -> bool:
    """Record the run in ``_job.json``; True if this run already wrote there (a resume).

    A different run id means different arguments: refuse rather than mix two jobs' rows. The file
    is created only if none is there (``io.create_new``), so of two runs claiming an empty output at
    the same moment one claims it and the other reads its claim (refused, or a resume of the same
    job, which then gives way to the running one: pipelines/attempts.py).
    """
    marker = io.join(output, "_job.json")
    if io.create_new(marker, json.dumps({"run_id": run_id, "arguments": arguments}, indent=1, sort_keys=True).encode()):
        return False
    existing = _read_claim(marker)
    if existing.get("run_id") != run_id:
        raise ValueError(
            f"{output} holds the output of another run ({existing.get('run_id')}, arguments "
            f"{existing.get('arguments')}); use a new --output, or the same arguments to resume it"
        )
    return True


def _read_claim(marker: str, tries: int = 20) -> dict:
    """``_job.json``, read again for a moment while it is empty (where files are created with
    ``O_EXCL``, another run's claim is empty until written) or gone (an S3 write still under way)."""
    for attempt in range(tries):
        try:
            if io.read_bytes(marker).strip():
                return io.read_json(marker)
        except FileNotFoundError:
            pass
        if attempt + 1 < tries:
            time.sleep(0.1)
    return io.read_json(marker)


def check_claim(output: str, run_id: str) -> None:
    """``_job.json`` still names this run: another run that claimed the output at the same moment
    may have written its own over it (refused, never mixed)."""
    marker = io.join(output, "_job.json")
    found = io.read_json(marker).get("run_id") if io.exists(marker) else None
    if found != run_id:
        raise ValueError(f"{output} was claimed by another run ({found}) while this one ({run_id}) started: "
                         "use a new --output")


START_OVER = "use a new --output, or --overwrite to start the job over"  # when its input changed: no resume
CLOSED = "_closed.json"  # an unfinished output whose remaining products a later --skip-existing job took over


def close(output: str, by: str) -> bool:
    """Mark the unfinished job in ``output`` closed: ``by``, a later job run with --skip-existing,
    skips the products it committed and extracts the rest itself, so resuming it would write those
    twice (``check_open``). True if this call wrote the mark (False: it was closed before)."""
    marker = io.join(output, CLOSED)
    if io.exists(marker):
        return False
    io.write_json(marker, {"by": by, "at": time.time()})
    return True


def reopen(output: str) -> None:
    """Take back a ``close`` of ``output`` (the job that closed it gave way before it ran)."""
    io.delete_if_exists(io.join(output, CLOSED))


def check_open(output: str) -> None:
    """``ValueError`` if the job in ``output`` was closed by a later --skip-existing job (``close``).

    A close by a job that has since left its output (it failed before it committed anything, and
    deleted what it wrote: no ``_job.json`` there) took over nothing: it is taken back here."""
    marker = io.join(output, CLOSED)
    if not io.exists(marker):
        return
    closed = io.read_json(marker)
    if closed.get("by") and not io.exists(io.join(closed["by"], "_job.json")):
        reopen(output)
        return
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(closed.get("at", 0)))
    raise ValueError(f"the job in {output} is closed: `hpd extract --skip-existing` for {closed.get('by')} found it "
                     f"unfinished on {when} and took over the products it had not committed; resuming it would "
                     "write those twice. Its committed values stand as they are; --overwrite starts it over (its "
                     "products are then in both outputs)")


def closed_reason(output: str) -> str | None:
    """Why no attempt may write to ``output`` any more: a later --skip-existing job closed it (``close``)."""
    if io.exists(marker := io.join(output, CLOSED)):
        by = io.read_json(marker).get("by")
        return f"`hpd extract --skip-existing` for {by} closed it and extracts the products it had not committed"
    return None


def check_lease(output: OutputConfig) -> None:
    """``attempts.LostLeaseError`` if the attempt writing ``output`` may no longer write there (see
    pipelines/attempts.py); nothing for an unnamed attempt."""
    if output.attempt is None:
        return
    looked = [attempts.record_uri(output.uri, output.attempt), attempts.taken_uri(output.uri, output.attempt),
              io.join(output.uri, CLOSED)]
    if io.exist(looked) == [True, False, False]:  # the usual answer, in one file system's requests
        return
    attempts.check_lease(output.uri, output.attempt, also=lambda: closed_reason(output.uri))  # raises, saying why


def _deletion_rank(name: str) -> int:
    """The order a job's files are deleted in: the report and the commit manifests first (an output
    whose delete was interrupted must not pass for a finished job, nor count chunks whose files are
    gone), the data next, then the marks of `hpd compact` (while they are there, an unfinished job
    is known to hold packed files that no chunk replaces: ``deletion_stopped``), the attempts'
    records, and the claim (``_job.json``) last (until then a run can still tell the folder is an
    hpd extract output and delete the rest with --overwrite)."""
    if name.startswith("_report"):
        return 0
    return {"_commits": 1, COMPACTED: 3, COMPACTING: 3, "_attempts": 3, "_job.json": 4}.get(name, 2)


def deletion_stopped(output: str) -> bool:
    """Whether the unfinished job in ``output`` is what a deletion (``discard``) left when it was
    stopped after the report and some data went: it holds a mark of `hpd compact`, which only packs
    finished jobs and is deleted after the data. Resuming it would rerun the chunks whose manifests
    are gone beside the packed files that still hold their rows (each row twice): the next run
    finishes the deletion instead and starts the job over."""
    return any(io.exist([io.join(output, COMPACTED), io.join(output, COMPACTING)]))


def discard(output: str, keep: str | None = None) -> None:
    """Delete everything under ``output`` (the folder itself stays) but the file ``keep`` (an
    attempt's record: the lease held while the files go), in ``_deletion_rank`` order: --overwrite,
    or a failed run that committed nothing. Only called on outputs that hold an hpd extract job
    (``_job.json``) or nothing. A file gone meanwhile (an attempt that gave way took its record) is
    passed over."""
    fs, path = io.filesystem(output)
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return
    kept = io.filesystem(keep)[1] if keep is not None else None
    entries = sorted(fs.get_file_info(pafs.FileSelector(path)), key=lambda i: (_deletion_rank(i.base_name), i.path))
    for info in entries:
        if info.path == kept:
            continue
        try:
            if kept is not None and kept.startswith(info.path + "/"):  # the folder that holds it
                discard(io.to_uri(fs, info.path), keep)
            elif info.type == pafs.FileType.Directory:
                fs.delete_dir(info.path)
            else:
                fs.delete_file(info.path)
        except FileNotFoundError:
            pass


@dataclass(frozen=True)
class ResumeState:
    """What the commit markers under an output say is done."""

    done: dict[str, frozenset[int]] = field(default_factory=dict)  # shard -> committed chunk indices
    totals: dict[str, int] = field(default_factory=dict)  # shard -> chunks, once fully read
    manifests: tuple[str, ...] = ()

    def complete(self, shard_id: str) -> bool:
        return shard_id in self.totals and len(self.done.get(shard_id, ())) >= self.totals[shard_id]


def scan(output: str) -> ResumeState:
    """List the commit markers (one listing, no reads)."""
    done: dict[str, set[int]] = {}
    totals, manifests = {}, []
    for uri in io.list_files(io.join(output, "_commits")):
        if match := _COMMIT_NAME.search(uri):
            done.setdefault(match[1], set()).add(int(match[2]))
            manifests.append(uri)
        elif match := _SHARD_NAME.search(uri):
            totals[match[1]] = int(match[2])
    return ResumeState({s: frozenset(i) for s, i in done.items()}, totals, tuple(manifests))


def write_chunk(batch: pa.Table, output: OutputConfig) -> pa.Table:
    """Writer stage: write each chunk's files, then its manifest; return its counters."""
    summaries = []
    for row in batch.to_pylist():
        stats = json.loads(row["stats"])
        attributes = io.table_from_bytes(row["attributes"])
        rejected = io.table_from_bytes(row["rejected"])
        accounting.check_chunk(row["chunk"], row, stats, attributes, rejected)  # by row identity, before any write
        check_lease(output)  # a paused attempt that woke up after another took over writes nothing

        def write_category(category: str) -> None:
            uri = attributes_uri(output.uri, category, row["chunk"])
            part = attributes.filter(pc.equal(attributes[PARTITION_COLUMN], category))
            if part.num_rows:
                # The directory carries the category (Hive convention): a column of the same name
                # makes readers that infer partitions (pandas, pyarrow.parquet) refuse the folder.
                io.write_parquet(uri, part.drop_columns([PARTITION_COLUMN]))
            else:
                io.delete_if_exists(uri)

        def write_rejected() -> None:
            if rejected.num_rows:
                io.write_parquet(rejected_uri(output.uri, row["chunk"]), rejected)
            else:
                io.delete_if_exists(rejected_uri(output.uri, row["chunk"]))

        # a chunk's files at once: one request each on S3, a file per category of the chunk (dozens
        # with many categories); one after another they kept the writers far behind the decoders
        writes = [lambda category=category: write_category(category) for category in row["categories"]]
        with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(writes) + 1)) as pool:
            for done in [pool.submit(write) for write in [*writes, write_rejected]]:
                done.result()  # the first error, after every write has ended (none left running)
        manifest = {
            "chunk": row["chunk"],
            "run_id": output.run_id,
            "committed_at": time.time(),
            "stats": stats,
            "owned_ids": row["owned_ids"],
            "rejected_ids": row["rejected_ids"],
        }
        check_lease(output)  # again before the commit: the files may have taken a while
        io.write_json(commit_uri(output.uri, row["shard"], row["index"]), manifest)
        summaries.append({"chunk": row["chunk"], "stats": row["stats"]})
    return pa.Table.from_pylist(summaries, schema=pa.schema([("chunk", pa.string()), ("stats", pa.string())]))


def committed_stats(batch: pa.Table, run_id: str) -> pa.Table:
    """Counters of committed chunks (a resumed run's earlier attempts), for the report's totals. A
    manifest of another run (a job that went on writing after `--overwrite` deleted its output) is
    refused: its chunk would count as this run's."""
    summaries = []
    for uri in batch.column("uri").to_pylist():
        try:
            manifest = io.read_json(uri)
        except ValueError as err:
            raise ValueError(f"{err}: not a manifest written by hpd extract; delete it to redo its chunk") from err
        if manifest.get("run_id") != run_id:
            raise ValueError(f"{uri} was committed by run {manifest.get('run_id')}, not {run_id}, the run this output "
                             "holds: another job wrote here; use a new --output (or --overwrite once it has stopped)")
        summaries.append({"chunk": manifest["chunk"], "stats": json.dumps(manifest["stats"])})
    return pa.Table.from_pylist(summaries, schema=pa.schema([("chunk", pa.string()), ("stats", pa.string())]))
