"""Compaction of a finished `hpd extract` output: its many small Parquet files packed into few.

The job writes one file per chunk and category (pipelines/commit.py): the unit it replaces on a
retry and commits with the chunk's manifest. With many categories these are small (a 500-category
catalog: 2 KB and 32 products the median), and readers pay per file. Once the job has finished
(``_report.json``) nothing replaces them any more, so each partition's (``attributes/category=*/``,
and ``rejected/``) consecutive small files are packed, in name order, into groups of up to
``target_mb`` of input bytes, and each group is streamed into one new file (``compacted_name``: the
first original's chunk key, so the files keep their order, then ``.compacted-<hex>``, which no chunk
key can be). A file of half the target or more, and a group of one file, stay as they are.

```
_compacting.json        a compaction works here, or was stopped: readers must wait (``check_readable``)
_compaction/<id>.json   one group on its way: its new file and the originals it replaces
_compacted.json         the figures of each compaction that finished here
```

Every row stays exactly once, however a compaction ends. Each group: its journal entry is written
first (pipelines/compact_journal.py), then its new file (to a temporary name, moved into place whole:
``io.writing``), then the originals are deleted, then the entry. A compaction that starts (the next,
after one was killed) first ends every entry left (``compact_journal.finish``): where the new file
is in place and some originals are gone, the rest are deleted; otherwise the group is undone (its new
file, if any, deleted: its rows are all in the originals). A group that fails before its new file is
in place is undone at once; where no group is left half done, a failed compaction removes its
marker, so the output is readable again (an error such as a file of another schema, which fails
every time, says so). An entry written only after the new file would leave, for a compaction killed
between the two, a file whose rows are also in its originals, and nothing to say so.

While it runs (from ``_compacting.json`` written to removed) a group's rows can be in both its new
file and its originals for a moment: readers should not read the output then, and this project's
do not (``check_readable``: `hpd evaluate`, `hpd pick`, `hpd rejected`). It holds the output's lease
as an attempt of `hpd compact` (pipelines/attempts.py), so an `hpd extract --overwrite` gives way to it.
A compaction paused long enough (3 heartbeats) is taken over: by another compaction, which ends its
journal entries, or by an ``--overwrite``, which deletes the output and writes files of the same names
again. So that a woken one changes nothing, it checks its lease right before each step that cannot
be taken back: putting a new file in place and again once it is there (a lost lease then deletes
that file, whose name no other attempt uses: a taker undid its group, or will, or deleted the
output), deleting the originals (each only while it is still the file its entry recorded: its size
and time), deleting the entry, writing and removing the marker; and ``journal.finish`` checks it
before each of its steps. What is left is a pause of 3 heartbeats between such a check and its step:

- before an S3 DeleteObjects of a group's originals: an ``--overwrite`` may have written files of
  those names, which it deletes (locally each file's size and time are looked at right before its
  unlink); a compaction that took over may be packing them, and fails;
- before the marker is written (after the check at the start) or removed: the marker of a compaction
  that took over and is at work is overwritten (harmless) or removed (readers may read its groups
  half done until it ends).

A compaction that lost its lease ends with ``attempts.LostLeaseError`` (whatever it tripped on then),
and removes its marker where it names it and no other compaction is at work. One that ends deletes
the records (and ``.taken`` markers) of the compactions it took over (``attempts.forget_taken``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import TextIO

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines import attempts, io
from pipelines import compact_journal as journal
from pipelines.compact_journal import JOURNAL, File, Output, data_files  # noqa: F401 (this module's names too)
from pipelines.schema import PARTITION_COLUMN

MARKER = "_compacting.json"
DONE = "_compacted.json"
ATTRIBUTES, REJECTED = "attributes", "rejected"
MIB = 1 << 20


@dataclass(frozen=True)
class CompactConfig:
    """uri: a finished `hpd extract` output (local or s3://).
    target_mb: the most input bytes packed into one new file (MiB); files of half of it or more stay.
    workers: partitions compacted at once (threads: the work is mostly waiting on storage).
    row_group_rows: rows gathered before they are written as one row group of a new file (a row group
        per small file would leave tens of thousands in a file's footer); with one small file, the
        most rows a worker holds.
    progress_seconds: how often the progress line is written.
    dry_run: list and plan only; nothing is written."""

    uri: str
    target_mb: int = 256
    workers: int = 8
    row_group_rows: int = 1 << 17
    progress_seconds: float = 5.0
    dry_run: bool = False
    heartbeat_seconds: float = attempts.HEARTBEAT_SECONDS

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str) or not self.uri:
            raise ValueError("the output URI must be a non-empty string")
        for name in ("target_mb", "workers", "row_group_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive whole number, got {value!r}")
        if self.progress_seconds <= 0 or self.heartbeat_seconds <= 0:
            raise ValueError("progress_seconds and heartbeat_seconds must be positive")

    @property
    def target_bytes(self) -> int:
        return self.target_mb * MIB


@dataclass
class Figures:
    """Files and bytes of the partitions compacted, before and after; ``groups``: new files written."""

    partitions: int = 0
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    groups: int = 0

    def add(self, other: Figures) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Result:
    output: str
    figures: Figures
    seconds: float
    dry_run: bool
    finished_groups: int = 0  # groups a stopped compaction left, finished first (their new file kept)
    undone_groups: int = 0  # ... and undone (their new file, if any, deleted; their originals kept)
    left_groups: int = 0  # dry run: the groups a stopped compaction left, to finish or undo
    planned: list[tuple[str, list[list[File]]]] = field(default_factory=list)  # dry run: partition -> groups

    def as_json(self) -> dict:
        figures = asdict(self.figures)
        if self.dry_run:
            figures["bytes_after"] = None  # not known before the files are written
            return {"output": self.output, **figures, "seconds": round(self.seconds, 2), "dry_run": True,
                    "left_groups": self.left_groups}
        return {"output": self.output, **figures, "seconds": round(self.seconds, 2), "dry_run": False,
                "finished_groups": self.finished_groups, "undone_groups": self.undone_groups}


def plan_groups(files: list[File], target_bytes: int) -> list[list[File]]:
    """Consecutive runs of ``files`` (in name order) of files under half ``target_bytes`` each, cut so
    that a group holds at most ``target_bytes``; groups of one file are left out (nothing to gain)."""
    groups: list[list[File]] = []
    current: list[File] = []
    held = 0
    for file in sorted(files, key=lambda f: f.name):
        if file.size * 2 >= target_bytes or (current and held + file.size > target_bytes):
            groups.append(current)
            current, held = [], 0
        if file.size * 2 < target_bytes:
            current.append(file)
            held += file.size
    groups.append(current)
    return [group for group in groups if len(group) > 1]


def compacted_name(first: str) -> str:
    """The new file of a group whose first original is ``first``: that file's chunk key (so it sorts
    where its originals did: `hpd rejected` writes records in file order), then ``.compacted-<hex>``,
    which no chunk key holds (a chunk key is ``<shard>-<index>``, pipelines/commit.py). The hex is
    random (64 bits) at each call, so a new file's name is its attempt's alone: one that lost its
    lease may delete its file without deleting a taker's."""
    return f"{first.split('.', 1)[0]}.compacted-{uuid.uuid4().hex[:16]}.parquet"


def check_readable(output: str) -> None:
    """``ValueError`` while a compaction works on ``output`` or was stopped there (``_compacting.json``):
    a group's rows may be in two files for a moment, so reading now could count them twice."""
    if io.exists(io.join(output, MARKER)):
        raise ValueError(compacting_message(output))


def compacting_message(output: str) -> str:
    return (f"{output} is being compacted, or a compaction was stopped there ({MARKER}), and may hold some rows "
            f"twice until it ends: wait for `hpd compact` to end, or run `hpd compact {output}` again to finish it")


@contextlib.contextmanager
def reading(output: str):
    """Read ``output`` in this block: refused while a compaction works there (``check_readable``), and
    a ``ValueError`` saying so, instead of what the reader tripped on or a wrong count, when one began
    or ended while the block read (a file gone, or a group's rows read from its new file and from its
    originals alike): the marker appeared, or ``_compacted.json`` changed."""
    before = _compactions(output)
    if before[0]:  # ``check_readable``, from the same request
        raise ValueError(compacting_message(output))
    try:
        yield
    except (OSError, ValueError) as err:
        if _compactions(output) != before:
            raise ValueError(_changed_message(output)) from err
        raise
    if _compactions(output) != before:
        raise ValueError(_changed_message(output))


def _compactions(output: str) -> tuple[bool, bytes | None]:
    """(whether a compaction works on ``output``, what ``_compacted.json`` says finished there)."""
    working, done = io.exist([io.join(output, MARKER), io.join(output, DONE)])
    return working, io.read_bytes(io.join(output, DONE)) if done else None


def _changed_message(output: str) -> str:
    return (f"`hpd compact` worked on {output} while this command read it, so what was read may miss or repeat rows: "
            "run this command again once the compaction has ended")


def check_finished(output: str, heartbeat_seconds: float = attempts.HEARTBEAT_SECONDS) -> None:
    """``ValueError`` unless ``output`` holds a finished `hpd extract` job that nothing works on."""
    if not io.exists(io.join(output, "_job.json")):
        raise ValueError(f"{output} is not an `hpd extract` output (no _job.json): give the --output of a finished job")
    if not io.exists(io.join(output, "_report.json")):
        raise ValueError(f"the job in {output} has not finished (no _report.json yet): its chunks' files are still "
                         "replaced as a unit, so only a finished output is compacted; the same `hpd extract` command "
                         "resumes it")
    if (why := attempts.busy(output, None, heartbeat_seconds)) is not None:
        raise ValueError(why)


def partitions(out: Output) -> list[str]:
    """The folders to compact, relative to the output: each ``attributes/category=*``, then ``rejected``."""
    infos = out.fs.get_file_info(pafs.FileSelector(out.path(ATTRIBUTES), allow_not_found=True))
    found = sorted(f"{ATTRIBUTES}/{i.base_name}" for i in infos
                   if i.type == pafs.FileType.Directory and i.base_name.startswith(f"{PARTITION_COLUMN}="))
    if out.fs.get_file_info(out.path(REJECTED)).type == pafs.FileType.Directory:
        found.append(REJECTED)
    return found


class _Lease:
    """This compaction's attempt record, kept fresh (pipelines/attempts.py): ``check`` raises once
    another command took the output over (this one was paused, or the store not written, too long)."""

    def __init__(self, out: Output, heartbeat_seconds: float) -> None:
        self.out = out
        attempt = attempts.begin(out.uri, "cpu", 0, 0.0, time.time(), command=attempts.COMPACT)
        self.heartbeat = attempts.Heartbeat(out.uri, attempt, heartbeat_seconds)
        self.name = attempt.name
        # the files ``attempts.lease_lost`` looks at, asked through ``out.fs`` (a group's check costs
        # two requests on the workers' connections, not two file systems: 4x the whole compaction on S3)
        self._record, self._taken = (uri[len(out.uri) + 1 :] for uri in (
            attempts.record_uri(out.uri, attempt), attempts.taken_uri(out.uri, attempt.name)))
        try:  # written first, looked second: of two starting together at least one sees the other
            if (why := attempts.busy(out.uri, attempt, heartbeat_seconds)) is not None:
                raise ValueError(why)
            attempts.mark_taken(out.uri, attempt, heartbeat_seconds)  # a stopped one that wakes stops
        except BaseException:
            self.release()
            raise

    def check(self) -> None:
        self.heartbeat.check()
        if self.out.exists(self._taken) or not self.out.exists(self._record):
            attempts.check_lease(self.out.uri, self.name)  # raises, saying why

    def release(self) -> None:
        attempts.remove(self.out.uri, self.heartbeat.stop(write=False))


def compact_partition(out: Output, partition: str, config: CompactConfig, lease: _Lease | None = None,
                      stop: threading.Event | None = None) -> tuple[Figures, list[list[File]]]:
    """Compact one partition folder (``lease`` None: plan only); its figures and its groups."""
    files = data_files(out, partition)
    groups = plan_groups(files, config.target_bytes)
    packed = [f for group in groups for f in group]
    figures = Figures(partitions=1, files_before=len(files), bytes_before=sum(f.size for f in files),
                      files_after=len(files) - len(packed) + len(groups), groups=len(groups))
    figures.bytes_after = figures.bytes_before - sum(f.size for f in packed)
    if lease is not None:
        for group in groups:
            if stop is not None and stop.is_set():
                raise _Stopped("stopped: another partition failed")
            figures.bytes_after += _write_group(out, partition, group, config, lease)
    return figures, groups


def _write_group(out: Output, partition: str, group: list[File], config: CompactConfig, lease: _Lease) -> int:
    """One group (see the module doc): entry, new file, originals deleted, entry deleted; the new file's
    bytes. A failure before the new file is put in place undoes the group (its entry goes)."""
    entry = journal.Entry(partition, compacted_name(group[0].name), tuple(group))
    entry.write(out, lease.name)
    placing = False
    try:
        with io.writing(out.uri_of(entry.new_file)) as local:
            rows = _stream(out.fs, [out.path(f"{partition}/{f.name}") for f in group], local, config.row_group_rows)
            if pq.read_metadata(local).num_rows != rows:
                raise OSError(f"{local}: the file written does not hold the {rows} rows of its {len(group)} originals")
            size = os.path.getsize(local)
            lease.check()  # once taken over, another compaction may have dropped this entry: put nothing in place
            placing = True
    except BaseException as err:
        if not placing:
            _undo_failed(out, entry, lease, err)
        raise
    try:  # again once it is in place (an S3 upload is no rename: a pause may end after a taker dropped the entry)
        lease.check()
    except attempts.LostLeaseError:  # a taker undoes a group whose originals are all there: no one keeps this file
        io.delete_files([out.uri_of(entry.new_file)])
        raise
    journal.delete_originals(out, entry, lease.check)
    journal.delete_entry(out, entry, lease.check)
    return size


def _undo_failed(out: Output, entry: journal.Entry, lease: _Lease, err: BaseException) -> None:
    """Undo a group whose new file was not put in place (its entry deleted), while the lease holds;
    where that fails, ``err`` says so (its entry stays for the next compaction to undo)."""
    try:
        journal.delete_entry(out, entry, lease.check)
    except attempts.LostLeaseError:
        raise
    except Exception as failed:
        err.add_note(f"its journal entry {entry.relative} stays (deleting it failed: {failed})")


def _stream(fs: pafs.FileSystem, paths: list[str], local: str, row_group_rows: int) -> int:
    """Append the files at ``paths``, in order, to one Parquet file at ``local``: one small file in
    memory at a time, and up to ``row_group_rows`` rows gathered per row group. The schema is the
    first file's, exactly (the others must have it: one job's files do); the rows written."""
    writer: pq.ParquetWriter | None = None
    pending: list[pa.Table] = []
    held = rows = 0
    try:
        for path in paths:
            table = pq.ParquetFile(fs.open_input_file(path)).read()
            if writer is None:
                writer = pq.ParquetWriter(local, table.schema)
            elif not table.schema.equals(writer.schema, check_metadata=False):
                raise ValueError(f"{path} has another schema than the files before it ({table.schema} against "
                                 f"{writer.schema}): not one job's files; nothing of its group was replaced")
            pending.append(table)
            held += table.num_rows
            rows += table.num_rows
            if held >= row_group_rows:
                writer.write_table(pa.concat_tables(pending), row_group_size=max(held, 1))
                pending, held = [], 0
        if writer is not None and pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=max(held, 1))
    finally:
        if writer is not None:
            writer.close()
    return rows


def compact(config: CompactConfig, stream: TextIO | None = None) -> Result:
    """Compact the finished output ``config.uri`` (see the module doc); progress to ``stream`` (stderr)."""
    stream = stream or sys.stderr
    started = time.time()
    output = config.uri.rstrip("/")
    check_finished(output, config.heartbeat_seconds)
    out = Output.at(output)
    if config.dry_run:
        figures, planned = _run(out, config, None, stream, started)
        return Result(output, figures, time.time() - started, True, left_groups=len(journal.entries(out)),
                      planned=planned)
    lease = _Lease(out, config.heartbeat_seconds)
    try:
        return _compact(out, config, lease, stream, started)
    except Exception as err:
        failure = _failure(out, lease, err)
        if failure is err:
            raise
        raise failure from err
    finally:
        lease.release()


def _compact(out: Output, config: CompactConfig, lease: _Lease, stream: TextIO, started: float) -> Result:
    io.write_json(out.uri_of(MARKER), {"attempt": lease.name, "started_at": started})
    lease.check()  # paused before the marker while another compaction ended: this one's marker goes (``_failure``)
    finished, undone = journal.finish(out, lease.check)
    if finished or undone:
        print(f"hpd compact: {finished + undone} group(s) a stopped compaction left: {finished} finished (their new "
              f"file kept), {undone} undone (their originals kept)", file=stream)
    figures, _ = _run(out, config, lease, stream, started)
    result = Result(out.uri, figures, time.time() - started, False, finished, undone)
    lease.check()
    _record(out, config, result)
    journal.remove_if_empty(out)
    attempts.forget_taken(out.uri, lease.name, attempts.COMPACT)
    lease.check()
    _remove_marker(out, lease.name)
    return result


def _failure(out: Output, lease: _Lease, err: Exception) -> Exception:
    """What a failed compaction raises: ``attempts.LostLeaseError`` once it lost its lease (whatever it
    tripped on then: a file a taker deleted), else ``err``. Its marker goes where it wrote it and no
    group is left half done (the output is readable again)."""
    try:
        lease.check()
    except attempts.LostLeaseError as lost:
        if not any(a.command == attempts.COMPACT and a.name != lease.name
                   for a in attempts.running(out.uri, None, lease.heartbeat.seconds)):
            _remove_marker(out, lease.name)  # another compaction at work removes it itself when it ends
        return lost
    if journal.entries(out):
        return err  # the same command finishes or undoes them
    journal.remove_if_empty(out)
    _remove_marker(out, lease.name)
    if isinstance(err, ValueError):  # not the store: it fails the same way until someone acts
        return ValueError(f"{err}. hpd compact stopped and left {out.uri} readable (each group packed or as it was, "
                          f"none half done): act on the error, then run `hpd compact {out.uri}` again to pack the rest")
    return err


def _remove_marker(out: Output, name: str) -> None:
    """``_compacting.json``, if it names the attempt ``name`` (another's is that one's to remove)."""
    try:
        named = io.read_json(out.uri_of(MARKER)).get("attempt")
    except FileNotFoundError:
        return
    if named == name:
        io.delete_files([out.uri_of(MARKER)])


def _run(out: Output, config: CompactConfig, lease: _Lease | None, stream: TextIO,
         started: float) -> tuple[Figures, list[tuple[str, list[list[File]]]]]:
    """Every partition, ``config.workers`` at a time (``lease`` None: planned only); the figures, and
    the partitions that have groups to pack, with their groups."""
    todo = partitions(out)
    figures, planned = Figures(), []
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="compact")
    try:
        pending: dict[Future, str] = {pool.submit(_stopping_on_error, stop, compact_partition, out, p, config,
                                                  lease, stop): p for p in todo}
        while pending:
            done, _ = wait(pending, timeout=config.progress_seconds, return_when=FIRST_EXCEPTION)
            errors = [future.exception() for future in done if future.exception() is not None]
            if errors:  # the others stop at their next group (``_Stopped``): the error itself is raised
                raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
            for future in done:
                found, groups = future.result()
                figures.add(found)
                if groups:
                    planned.append((pending.pop(future), groups))
                else:
                    pending.pop(future)
            print(f"hpd compact{' --dry-run' if lease is None else ''}: {figures.partitions}/{len(todo)} partitions, "
                  f"{figures.files_before:,} -> {figures.files_after:,} files, {time.time() - started:.0f} s",
                  file=stream, flush=True)
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return figures, sorted(planned)


class _Stopped(Exception):
    """A worker's partition was given up, as another's failed."""


def _stopping_on_error(stop: threading.Event, work, *args):
    """``work(*args)``; an error also stops the other workers before their next group."""
    try:
        return work(*args)
    except BaseException:
        stop.set()
        raise


def _record(out: Output, config: CompactConfig, result: Result) -> None:
    """Add this compaction's figures to ``_compacted.json``, so an operator can tell."""
    uri = out.uri_of(DONE)
    runs = io.read_json(uri).get("runs", []) if out.exists(DONE) else []
    runs.append({"at": time.time(), "target_mb": config.target_mb, **result.as_json()})
    io.write_json(uri, {"runs": runs})
