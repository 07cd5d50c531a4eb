"""The journal of `hpd compact` (pipelines/compact.py): the groups on their way, and how each is ended.

```
_compaction/<id>.json   one group: its new file, and the originals it replaces with the size and
                        modification time each had when listed (ns; whole seconds on S3)
```

A group's entry is written before its new file. A group is then ended one of two ways, by the
compaction that wrote it or by the next one (``finish``, for a compaction that was stopped):

- finished: its new file is in place and some of its originals were deleted. The rest go
  (``delete_originals``), then the entry.
- undone: its new file is not in place (its temporary goes), or it is and every original is still
  there (the new file goes: its rows are all in the originals). Then the entry goes.

Undoing, not finishing, a group whose originals are all there lets a compaction that lost its lease
after putting its new file in place delete that file (a new file's name is its attempt's alone,
``compact.compacted_name``): whoever took over undid the group or will, or deleted the output; no
one keeps that file. An original is deleted only while it is still the file its entry recorded
(its size and time): an ``hpd extract --overwrite`` that took the output over writes files of the
same names, which a woken compaction must not delete.

Every step that deletes something first calls ``check`` (the lease's check: it raises
``attempts.LostLeaseError`` once another command took the output over).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.fs as pafs

from pipelines import io

JOURNAL = "_compaction"
Check = Callable[[], None]  # raises once this compaction may no longer change the output


@dataclass(frozen=True)
class Output:
    """The output compacted: its URI, and one file system for its requests, which the workers share
    (a file system per request opens connections anew: on S3 the 8 workers of a compaction ran 6x
    slower so)."""

    uri: str
    fs: pafs.FileSystem
    root: str  # its path in ``fs``

    @classmethod
    def at(cls, uri: str) -> Output:
        return cls(uri, *io.filesystem(uri))

    @property
    def local(self) -> bool:
        return self.fs.type_name == "local"

    def uri_of(self, relative: str) -> str:
        return io.join(self.uri, relative)

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def exists(self, relative: str) -> bool:
        return self.fs.get_file_info(self.path(relative)).type != pafs.FileType.NotFound


@dataclass(frozen=True)
class File:
    """A data file as listed; ``mtime_ns`` None: not known (an entry of a compaction before
    2026-12), so any file of that name is taken for it."""

    name: str
    size: int
    mtime_ns: int | None = None

    def is_(self, found: File) -> bool:
        return self.mtime_ns is None or (self.size, self.mtime_ns) == (found.size, found.mtime_ns)


def data_files(out: Output, partition: str) -> list[File]:
    """The Parquet files of one partition folder (not hidden ones: a write on its way), by name."""
    infos = out.fs.get_file_info(pafs.FileSelector(out.path(partition), allow_not_found=True))
    return sorted((File(i.base_name, i.size, i.mtime_ns) for i in infos if i.type == pafs.FileType.File
                   and i.base_name.endswith(".parquet") and not i.base_name.startswith((".", "_"))),
                  key=lambda f: f.name)


@dataclass(frozen=True)
class Entry:
    """One group's journal entry: ``new``, the name of its new file, and its originals, in ``partition``."""

    partition: str
    new: str
    originals: tuple[File, ...]

    @property
    def relative(self) -> str:  # the entry's own file
        return f"{JOURNAL}/{self.new[: -len('.parquet')]}.json"

    @property
    def new_file(self) -> str:
        return f"{self.partition}/{self.new}"

    def write(self, out: Output, attempt: str) -> None:
        io.write_json(out.uri_of(self.relative), {
            "new": self.new_file, "attempt": attempt, "at": time.time(),
            "originals": [{"name": f"{self.partition}/{o.name}", "size": o.size, "mtime_ns": o.mtime_ns}
                          for o in self.originals]})

    @classmethod
    def read(cls, out: Output, path: str) -> Entry:
        with out.fs.open_input_stream(path) as stream:
            data = json.loads(stream.read())
        partition, new = data["new"].rsplit("/", 1)
        originals = tuple(File(o.rsplit("/", 1)[1], -1) if isinstance(o, str)  # before 2026-12: names only
                          else File(o["name"].rsplit("/", 1)[1], o["size"], o["mtime_ns"]) for o in data["originals"])
        return cls(partition, new, originals)


def entries(out: Output) -> list[str]:
    """The journal's entries (paths in ``out.fs``): groups a compaction began and did not end."""
    infos = out.fs.get_file_info(pafs.FileSelector(out.path(JOURNAL), allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".json")
                  and not i.base_name.startswith(io.TEMPORARY_PREFIX))


def finish(out: Output, check: Check) -> tuple[int, int]:
    """End every group a stopped compaction left (see the module doc): (finished, undone)."""
    finished = undone = 0
    check()
    _delete_temporaries(out, JOURNAL, "")  # entries a killed compaction was writing
    for path in entries(out):
        entry = Entry.read(out, path)
        if out.exists(entry.new_file) and not _all_there(out, entry):
            delete_originals(out, entry, check)
            finished += 1
        else:
            undo(out, entry, check)
            undone += 1
        delete_entry(out, entry, check)
    return finished, undone


def _all_there(out: Output, entry: Entry) -> bool:
    found = {f.name: f for f in data_files(out, entry.partition)}
    return all(o.name in found and o.is_(found[o.name]) for o in entry.originals)


def undo(out: Output, entry: Entry, check: Check) -> None:
    """Delete a group's new file, or the temporary of it that a killed compaction left; not its entry."""
    check()
    io.delete_files([out.uri_of(entry.new_file)])
    _delete_temporaries(out, entry.partition, entry.new)


def delete_originals(out: Output, entry: Entry, check: Check) -> None:
    """Delete those of a group's originals that are still there, each only if it is still the file
    the entry recorded; raises ``OSError`` (or ``check``'s error) at the first that is not."""
    found = {f.name: f for f in data_files(out, entry.partition)}
    present = [o for o in entry.originals if o.name in found]
    for original in present:
        if not original.is_(found[original.name]):
            _changed(out, entry, original, check)
    check()
    if not out.local:  # a pause between ``check`` and this request is the window left (module doc of compact)
        io.delete_files([out.uri_of(f"{entry.partition}/{o.name}") for o in present])
        return
    for original in present:  # the file's identity looked at right before each unlink
        path = out.path(f"{entry.partition}/{original.name}")
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            continue
        if not original.is_(File(original.name, stat.st_size, stat.st_mtime_ns)):
            _changed(out, entry, original, check)
        os.unlink(path)


def _changed(out: Output, entry: Entry, original: File, check: Check) -> None:
    check()  # the usual cause: another command took the output over and wrote it again
    raise OSError(f"{out.uri_of(entry.partition)}/{original.name} is not the file the compaction's journal "
                  f"recorded (size {original.size}, time {original.mtime_ns} ns): it was written again since, so it "
                  f"is not deleted; the journal entry {out.uri_of(entry.relative)} stays")


def delete_entry(out: Output, entry: Entry, check: Check) -> None:
    check()
    out.fs.delete_file(out.path(entry.relative))  # pyarrow's: on S3 the folder stays listable (an empty marker)


def _delete_temporaries(out: Output, folder: str, name: str) -> None:
    """The temporary files ``io.writing``/``io.write_bytes`` left in ``folder`` for the file ``name``
    ("": any) where its process was killed (local only: on S3 they are in the local temporary folder)."""
    if not out.local:
        return
    prefix = f"{io.TEMPORARY_PREFIX}{name}-" if name else io.TEMPORARY_PREFIX
    infos = out.fs.get_file_info(pafs.FileSelector(out.path(folder), allow_not_found=True))
    io.delete_files([i.path for i in infos if i.base_name.startswith(prefix)])


def remove_if_empty(out: Output) -> None:
    """The journal's local folder once empty (S3 has no folders to leave)."""
    if out.local:
        try:
            os.rmdir(out.path(JOURNAL))
        except OSError:  # not empty, or not there
            pass
