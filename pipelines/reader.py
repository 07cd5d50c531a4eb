"""Input: plan shards of a local or S3 prefix and read them as chunks of raw records.

Input is one file or a prefix of many: Parquet, or JSON Lines (``.jsonl``, ``.json``, ``.ndjson``,
optionally ``.gz``). The driver plans *shards* (a file, or a byte range of a large JSON Lines file);
a reader turns a shard into *chunks* of at most ``chunk_rows`` rows / ``chunk_bytes`` bytes. A
chunk is the unit of work and of commit: its key ``<shard_id>-<index>`` names every file it writes.
A prompt stacks products of one category from one chunk, so the reader first groups rows by
category: it reads a *window* of ``group_chunks`` chunks' worth of rows, puts the rows of each
category together (categories in the order they first appear, rows in file order), and cuts that
order into chunks (each chunk's rows in row order); an input already in category order is cut as
before (but for Parquet rows' lists, whose strings the grouped cut counts and the consecutive one,
kept as it was, counts as 8 bytes). With ``group_chunks`` 1 a chunk is consecutive rows, as before
2026-11-29. Chunk contents depend only on the shard's bytes and the config, so they are the same in
every run, which is what makes resume exactly-once. A row that cannot be read (malformed line,
corrupt or unsupported file) becomes a record with ``error`` set, never an exception.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines import jsontext
from pipelines.io import filesystem, to_uri
from pipelines.jsontext import KeyGivenTwice, given_twice

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
GZIP_SUFFIX = ".gz"
UNDERSTOOD = ", ".join([*PARQUET_SUFFIXES, *JSONL_SUFFIXES, *(s + GZIP_SUFFIX for s in JSONL_SUFFIXES)])
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class ReadConfig:
    """Where the input is and how it is cut into units of work.

    shard_bytes: JSON Lines files larger than this are split into byte ranges read in parallel.
    chunk_rows / chunk_bytes: a chunk closes at whichever comes first; chunks are the unit of
        work, stacking, commit and resume.
    group_chunks: rows are grouped by category over windows of this many chunks of the
        consecutive cut (fewer once a window holds ``WINDOW_BYTES``) before they are cut into
        chunks: where an input mixes its categories row by row, prompts then fill (2,000
        categories over 2,048-row chunks left about one product per category and prompt). 1:
        chunks of consecutive rows.
    read_block_bytes: size of one read from the file system.
    limit: only the first ``limit`` rows of the input (in file order) are processed.
    """

    uri: str
    limit: int | None = None
    shard_bytes: int = 256 << 20
    chunk_rows: int = 2048
    chunk_bytes: int = 16 << 20
    group_chunks: int = 8
    read_block_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str) or not self.uri:
            raise ValueError("input URI must be a non-empty string")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"limit must be a positive int, got {self.limit!r}")
        for name in ("shard_bytes", "chunk_rows", "chunk_bytes", "group_chunks", "read_block_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Shard:
    """A file or a byte range [start, end) of one; ``max_rows`` caps it when --limit is set."""

    shard_id: str
    uri: str
    kind: str  # "jsonl", "jsonl.gz", "parquet" or "unsupported"
    start: int
    end: int
    max_rows: int | None = None


def _kind(path: str) -> str:
    name = path.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(GZIP_SUFFIX) and name[: -len(GZIP_SUFFIX)].endswith(JSONL_SUFFIXES):
        return "jsonl.gz"
    return "unsupported"


def _hidden(root: str, path: str) -> bool:
    """Files under a ``_`` or ``.`` name (``_SUCCESS``, ``.crc``, ``_temporary/``) are not data."""
    relative = path[len(root) :].strip("/")
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


class InputFile(NamedTuple):
    uri: str
    size: int
    modified: int | None  # modification time, ns since the epoch (an S3 object's LastModified)


def list_input(uri: str) -> tuple[list[InputFile], list[str]]:
    """Every data file of the input, sorted by path, and the files passed over as not data
    (``_hidden``), so that a caller can say so."""
    fs, root = filesystem(uri)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        return [InputFile(to_uri(fs, root), info.size, _modified(info))], []
    if info.type != pafs.FileType.Directory:
        raise ValueError(f"--input {uri} does not exist")
    infos = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if i.type == pafs.FileType.File]
    files = sorted(InputFile(i.path, i.size, _modified(i)) for i in infos if not _hidden(root, i.path))
    ignored = sorted(to_uri(fs, i.path) for i in infos if _hidden(root, i.path))
    if not files:
        looks_like_data = [u for u in ignored if _kind(u) != "unsupported"]
        raise ValueError(f"--input {uri} holds no data files (.parquet, .jsonl, .json, .ndjson, optionally .gz)"
                         + (f"; files under names that begin with _ or . are not read, e.g. {looks_like_data[0]}"
                            if looks_like_data else ""))
    return [f._replace(uri=to_uri(fs, f.uri)) for f in files], ignored


def _modified(info: pafs.FileInfo) -> int | None:
    return None if info.mtime_ns is None else int(info.mtime_ns)


def _shard_id(file: InputFile, start: int, end: int) -> str:
    """A shard's identity: its file's path and size and its byte range (a file whose size changed is
    another input; one changed in place to the same size is caught by ``modification_digest``)."""
    return hashlib.sha256(f"{file.uri}|{file.size}|{start}|{end}".encode()).hexdigest()[:16]


def modification_digest(files: list[InputFile]) -> str:
    """One digest of the input files' modification times: a job records it when it starts, and a
    later run of the job that finds another says so (a file may have been rewritten in place, to
    the same size; or only copied or touched, so a warning, not a refusal)."""
    text = "\n".join(f"{f.uri}|{f.modified}" for f in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class InputPlan:
    """The input's shards; the files passed over for their names that look like data; the digest
    of the files' modification times (``modification_digest``)."""

    shards: list[Shard]
    ignored: list[str]
    modified: str
    unsupported: tuple[str, ...] = ()  # files of a folder beside its data files, of no type it reads


def plan_shards(config: ReadConfig) -> list[Shard]:
    """The input's shards in file order; with ``limit`` only those holding the first rows."""
    return plan_input(config).shards


def plan_input(config: ReadConfig) -> InputPlan:
    """``plan_shards``, the files of the input that look like data (by their suffix) and are passed
    over for their names (``_hidden``: say so, nothing else will), and the files' digest of
    modification times."""
    files, ignored = list_input(config.uri)
    ignored = [uri for uri in ignored if _kind(uri) != "unsupported"]  # not _SUCCESS, .crc, ...
    modified = modification_digest(files)
    if all(_kind(f.uri) == "unsupported" for f in files):  # a mistake, not rows to reject one by one
        names = ", ".join(f.uri.rsplit("/", 1)[-1] for f in files[:3]) + (", ..." if len(files) > 3 else "")
        raise ValueError(f"--input {config.uri} holds no data files (.parquet, .jsonl, .json, .ndjson, optionally .gz; "
                         f"found {names})")
    unsupported = tuple(f.uri for f in files if _kind(f.uri) == "unsupported")  # each read as one rejected row
    shards = []
    for file in files:
        kind = _kind(file.uri)
        step = config.shard_bytes if kind == "jsonl" else max(file.size, 1)
        for start in range(0, max(file.size, 1), step):
            end = min(start + step, file.size)
            shards.append(Shard(_shard_id(file, start, end), file.uri, kind, start, end))
    if config.limit is None:
        return InputPlan(shards, ignored, modified, unsupported)
    limited, remaining = [], config.limit
    for shard in shards:
        if remaining == 0:
            break
        take = sum(1 for _ in itertools.islice(_raw_rows(shard, config.read_block_bytes), remaining))
        if take:
            limited.append(replace(shard, max_rows=take))
        remaining -= take
    return InputPlan(limited, ignored, modified, unsupported)


REQUIRED_COLUMNS = ("product_id", "category", "title")


def check_format(shards: list[Shard], config: ReadConfig) -> None:
    """Refuse an input whose files are of another format than their names say, before the job
    starts, rather than reject every row of it one by one: a ``.json`` file holding a JSON array or
    a pretty-printed object (JSON Lines is one object per line), a Parquet file without the columns
    every record needs. Only the first file of each kind is read (its first line, or its schema),
    so a catalog of many files is not read twice; a broken row further on is rejected as before."""
    seen = set()
    for shard in shards:
        if shard.kind in seen or shard.start != 0 or shard.kind == "unsupported":
            continue
        if shard.kind == "parquet":
            seen.add(shard.kind)
            _check_parquet_columns(shard)
            continue
        first = next(iter(_jsonl_lines(shard, config.read_block_bytes)), None)
        if first is None:
            continue  # an empty file: the next one of its kind is read instead
        seen.add(shard.kind)
        if isinstance(first, _Unreadable):
            continue  # an unreadable gzip file: its row says why
        line = first.strip()
        convert = f"convert it, e.g. jq -c '{'.[]' if line.startswith(b'[') else '.'}' FILE > FILE.jsonl"
        if line.startswith(b"["):
            raise ValueError(f"--input {shard.uri} holds a JSON array (its first line begins with '['): hpd extract "
                             f"reads JSON Lines, one record object per line: {convert}")
        if line == b"{":
            raise ValueError(f"--input {shard.uri} holds pretty-printed JSON (its first line is '{{' alone): hpd "
                             f"extract reads JSON Lines, one record object per line: {convert}")


def _check_parquet_columns(shard: Shard) -> None:
    fs, path = filesystem(shard.uri)
    try:
        with fs.open_input_file(path) as file:
            names = pq.ParquetFile(file).schema_arrow.names
    except (pa.ArrowInvalid, OSError) as err:
        if from_the_store(err):
            raise
        return  # a corrupt file: read as one rejected row, which says why
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        other = {n.strip().casefold(): n for n in names}
        hints = [f"{other[c]!r} for {c!r}" for c in missing if c in other]
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise ValueError(f"--input {shard.uri} has no column {' or '.join(missing)} (its columns: {shown or 'none'}); "
                         f"every record needs {', '.join(REQUIRED_COLUMNS)}"
                         + (f" (column names are lower case: it has {'; '.join(hints)})" if hints else
                            ": rename the columns that hold them"))


@dataclass(frozen=True)
class RawRecord:
    """One input row: its index in the shard, the parsed value, and the original text."""

    row: int
    value: object
    text: str
    error: str | None = None  # set when the row could not be read or parsed


class _Unreadable:
    """A placeholder row for a file (or the rest of one, or one row of it) that could not be read."""

    def __init__(self, uri: str, error: str, row: int | None = None):
        self.text = json.dumps({"file": uri} if row is None else {"file": uri, "row": row})
        self.error = error


def from_the_store(err: BaseException) -> bool:
    """An error of the store or the operating system (S3's, pyarrow's messages say "AWS Error"; an
    I/O error, a file gone), not of the file's bytes: it is raised, and stops the job (a resume
    reads the file again), never taken for a corrupt file whose rest is one rejected row."""
    return "AWS Error" in str(err) or getattr(err, "errno", None) is not None


def _jsonl_lines(shard: Shard, block_bytes: int) -> Iterator[bytes | _Unreadable]:
    """Non-blank lines whose first byte lies in [start, end) (gzip files: the whole file). A gzip
    file that cannot be decompressed (cut short, or not gzip at all) ends in one unreadable row for
    the rest of it; errors from the store (``from_the_store``) are raised."""
    fs, path = filesystem(shard.uri)
    if shard.kind != "jsonl.gz":
        yield from _lines(fs.open_input_file(path), shard.start, shard.end, block_bytes)
        return
    produced = 0
    try:
        for line in _lines(fs.open_input_stream(path, compression="gzip"), 0, None, block_bytes):
            produced += 1
            yield line
    except (OSError, EOFError) as err:  # pyarrow: "Truncated compressed stream", "zlib inflate failed"
        if from_the_store(err):
            raise
        where = f"after row {produced}" if produced else "at its start"
        yield _Unreadable(shard.uri, f"malformed gzip file ({where}): {err}")


def _lines(stream, position: int, end: int | None, block_bytes: int) -> Iterator[bytes]:
    """``_jsonl_lines`` of an open stream, from byte ``position`` to ``end`` (None: its end)."""
    with stream:
        buffer = b""
        if position > 0:  # skip the line that started before this range
            stream.seek(position - 1)
            position -= 1
            while b"\n" not in buffer:
                block = stream.read(block_bytes)
                if not block:
                    return
                buffer += block
            cut = buffer.index(b"\n") + 1
            position, buffer = position + cut, buffer[cut:]
        while end is None or position < end:
            newline = buffer.find(b"\n")
            if newline < 0:
                block = stream.read(block_bytes)
                if block:
                    buffer += block
                    continue
                if not buffer:
                    return
                newline = len(buffer) - 1  # the last line has no newline
            line, buffer = buffer[: newline + 1], buffer[newline + 1 :]
            start, position = position, position + len(line)
            if start == 0 and line.startswith(UTF8_BOM):
                line = line[len(UTF8_BOM) :]  # a byte-order mark is not part of the first record
            if line.strip():
                yield line


def _parquet_rows(shard: Shard, block_bytes: int) -> Iterator[dict | _Unreadable]:
    """Rows of a Parquet file as dicts; a corrupt file (or the rest of one) becomes one bad row.

    Errors that come from the store rather than the bytes (``from_the_store``) are raised: the job
    stops (a resume reads the file again) instead of rejecting readable data.
    """
    fs, path = filesystem(shard.uri)
    produced = 0
    try:
        with fs.open_input_file(path) as file:
            parquet = pq.ParquetFile(file)
            meta = parquet.metadata
            data_bytes = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            rows_per_batch = max(1, block_bytes * max(1, meta.num_rows) // max(1, data_bytes))
            twice = given_twice(parquet.schema_arrow.names)  # a row as a dict would keep the last
            for batch in parquet.iter_batches(batch_size=rows_per_batch, columns=[] if twice else None):
                rows = [_Unreadable(shard.uri, f"a column given more than once in the file: {twice}", produced + i)
                        for i in range(batch.num_rows)] if twice else _batch_rows(batch, shard.uri, produced)
                for row in rows:
                    produced += 1
                    yield row
    except (pa.ArrowInvalid, OSError) as err:
        if from_the_store(err):
            raise
        where = f"after row {produced}" if produced else "at open"
        yield _Unreadable(shard.uri, f"malformed Parquet file ({where}): {err}")


def _batch_rows(batch: pa.RecordBatch, uri: str, first: int) -> list[dict | _Unreadable]:
    """A Parquet batch's rows as dicts; a row holding a string that is not UTF-8 (a writer that does
    not check) becomes an unreadable row of its own, and the rows beside it are read as usual."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        rows = []
        for i in range(batch.num_rows):
            try:
                rows.append(batch.slice(i, 1).to_pylist()[0])
            except UnicodeDecodeError as err:
                rows.append(_Unreadable(uri, f"malformed Parquet row: a string that is not UTF-8 ({err})", first + i))
        return rows


def _raw_rows(shard: Shard, block_bytes: int) -> Iterator[bytes | dict | _Unreadable]:
    """Raw rows of a shard, capped by ``max_rows``."""
    if shard.kind == "parquet":
        rows = _parquet_rows(shard, block_bytes)
    elif shard.kind in ("jsonl", "jsonl.gz"):
        rows = _jsonl_lines(shard, block_bytes)
    else:
        rows = iter([_Unreadable(shard.uri, f"unsupported file type (expected {UNDERSTOOD}; a CSV file: convert it "
                                            "to JSON Lines or Parquet)")])
    for count, row in enumerate(rows):
        if shard.max_rows is not None and count >= shard.max_rows:
            return
        yield row


def _size(raw: bytes | dict | _Unreadable) -> int:
    """A row's size as the consecutive cut (``group_chunks`` 1) has always counted it: a Parquet
    row's list column (features) as 8 bytes. Kept as it was: outputs started before 2026-11-29
    resume with this cut, and another count would move their chunks' edges."""
    if isinstance(raw, bytes):
        return len(raw)
    if isinstance(raw, _Unreadable):
        return len(raw.text)
    return sum(len(v) if isinstance(v, str) else 8 for v in raw.values()) + 8 * len(raw)


def _full_size(raw: bytes | dict | _Unreadable) -> int:
    """A row's size with its Parquet lists' strings counted (the grouped cut's, which bounds a
    window's memory: a row of long features counted as 8 bytes let a chunk grow past chunk_bytes)."""
    if not isinstance(raw, dict):
        return _size(raw)
    return sum(_value_size(v) for v in raw.values()) + 8 * len(raw)


def _value_size(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return 8 + sum(_value_size(v) for v in value)
    return 8


def parse_raw(row: int, raw: bytes | dict | _Unreadable) -> RawRecord:
    """Parse one raw row; failures become a RawRecord with ``error`` set (a rejected row)."""
    if isinstance(raw, _Unreadable):
        return RawRecord(row, None, raw.text, raw.error)
    if isinstance(raw, dict):
        return RawRecord(row, raw, json.dumps(raw, default=str))
    text = raw.decode("utf-8", errors="backslashreplace").rstrip("\r\n")
    try:
        value = jsontext.loads(raw)
    except KeyGivenTwice as err:
        return RawRecord(row, None, text, f"{err} (JSON would keep only the last)")
    except UnicodeDecodeError as err:  # before ValueError, its base: the file's encoding, not its JSON
        return RawRecord(row, None, text, f"the line is not UTF-8 text (byte 0x{raw[err.start:err.start + 1].hex()} at byte "
                         f"{err.start} of the line): JSON Lines are UTF-8; re-encode the file (e.g. iconv -f latin1 "
                         "-t utf-8) and run it again")
    except (ValueError, RecursionError) as err:  # JSONDecodeError, bad UTF-8, huge ints, deep nesting
        return RawRecord(row, None, text, "malformed JSON line (JSON Lines: one object per line): "
                         f"{str(err)[:200] or type(err).__name__}")
    return RawRecord(row, value, text)


def chunk_digest(records: list[RawRecord]) -> str:
    """A chunk's rows as read (their text, in order), kept by the id index and each manifest: a
    chunk must read the same on every pass, or the input changed under the job."""
    digest = hashlib.blake2b(digest_size=16)
    for record in records:
        digest.update(record.text.encode("utf-8", "surrogatepass") + b"\n")
    return digest.hexdigest()


def iter_records(shard: Shard, config: ReadConfig) -> Iterator[RawRecord]:
    """A shard's rows in file order, parsed, each with its index in the shard (the order the
    duplicate rule goes by: file, shard, row), whatever ``group_chunks`` is."""
    for row, raw in enumerate(_raw_rows(shard, config.read_block_bytes)):
        yield parse_raw(row, raw)


def iter_chunks(shard: Shard, config: ReadConfig, skip: frozenset[int] = frozenset()):
    """Yield ``(index, records)`` per chunk, records in row order; ``records`` is None for chunks in
    ``skip``. With ``group_chunks`` > 1, rows grouped by category over windows (module doc). The
    generator's value (``StopIteration.value``) is the number of rows read, skipped chunks' too."""
    if config.group_chunks > 1:
        return (yield from _grouped_chunks(shard, config, skip))
    index, pending, size, first_row = 0, [], 0, 0
    for row, raw in enumerate(_raw_rows(shard, config.read_block_bytes)):
        pending.append(raw)
        size += _size(raw)
        if len(pending) >= config.chunk_rows or size >= config.chunk_bytes:
            yield index, _finish(index, pending, first_row, skip)
            index, pending, size, first_row = index + 1, [], 0, row + 1
    if pending:
        yield index, _finish(index, pending, first_row, skip)
    return first_row + len(pending)


WINDOW_BYTES = 32 << 20  # a window closes at the first chunk boundary past this many raw bytes (parsed: about 4.5x)


def _grouped_chunks(shard: Shard, config: ReadConfig, skip: frozenset[int]):
    """``iter_chunks`` with rows grouped by category. A window is ``group_chunks`` chunks of the
    consecutive cut (fewer once it holds ``WINDOW_BYTES``), so its edges are chunk edges of that
    cut; it is parsed whole (skipped chunks too: their rows decide where the others fall), its rows
    of each category put together, and cut into chunks as ``iter_chunks`` cuts rows."""
    index, rows = 0, 0
    for first_row, pending, sizes in _windows(_raw_rows(shard, config.read_block_bytes), config):
        rows = first_row + len(pending)
        for records in _cut_window([parse_raw(first_row + i, r) for i, r in enumerate(pending)], sizes, config):
            yield index, None if index in skip else records
            index += 1
    return rows


def _windows(raws, config: ReadConfig):
    """(first row, raw rows, their sizes) of each window: ``group_chunks`` chunks of the consecutive
    cut, fewer once it holds ``WINDOW_BYTES``."""
    pending, sizes, first_row = [], [], 0
    closed, rows, size, window = 0, 0, 0, 0  # chunks of the consecutive cut in the window; the open one's rows, bytes
    for row, raw in enumerate(raws):
        pending.append(raw)
        sizes.append(_full_size(raw))
        rows, size, window = rows + 1, size + sizes[-1], window + sizes[-1]
        if rows >= config.chunk_rows or size >= config.chunk_bytes:
            closed, rows, size = closed + 1, 0, 0
            if closed >= config.group_chunks or window >= WINDOW_BYTES:
                yield first_row, pending, sizes
                pending, sizes, first_row, closed, window = [], [], row + 1, 0, 0
    if pending:
        yield first_row, pending, sizes


def _cut_window(records: list[RawRecord], sizes: list[int], config: ReadConfig) -> list[list[RawRecord]]:
    """A window's records cut into chunks: the rows of each category together, categories in the
    order they first appear (a row without one, to be rejected, goes with the row before it), each
    chunk closed at ``chunk_rows`` rows or ``chunk_bytes`` bytes, its records in row order. An input
    already in category order is cut exactly as consecutive rows are."""
    first: dict[str, int] = {}
    keys: list[int] = []
    for i, record in enumerate(records):
        category = _category(record)
        keys.append(first.setdefault(category, i) if isinstance(category, str) else keys[-1] if keys else i)
    chunks, chunk, size = [], [], 0
    for i in sorted(range(len(records)), key=lambda i: (keys[i], i)):
        chunk.append(i)
        size += sizes[i]
        if len(chunk) >= config.chunk_rows or size >= config.chunk_bytes:
            chunks.append(chunk)
            chunk, size = [], 0
    if chunk:
        chunks.append(chunk)
    return [[records[i] for i in sorted(chunk)] for chunk in chunks]


def _category(record: RawRecord) -> object:
    return record.value.get("category") if isinstance(record.value, dict) else None


def _finish(index, pending, first_row, skip):
    if index in skip:
        return None
    return [parse_raw(first_row + i, raw) for i, raw in enumerate(pending)]


def has_rows(shards: list[Shard], config: ReadConfig) -> bool:
    """Whether the input holds at least one row (an unreadable file counts: it becomes a rejected row)."""
    return any(next(iter(_raw_rows(shard, config.read_block_bytes)), None) is not None for shard in shards)


def _parquet_rows_in(shard: Shard) -> int:
    fs, path = filesystem(shard.uri)
    try:
        with fs.open_input_file(path) as file:
            return pq.ParquetFile(file).metadata.num_rows
    except (pa.ArrowInvalid, OSError):
        return 1  # read as one rejected row (see _parquet_rows)


def _jsonl_rows_per_byte(shard: Shard, config: ReadConfig) -> float:
    """From the shard's first block: rows per byte."""
    sample = replace(shard, end=min(shard.end, shard.start + config.read_block_bytes))
    lines = list(_jsonl_lines(sample, config.read_block_bytes))
    return len(lines) / max(1, sum(map(len, lines)))


def count_rows(shards: list[Shard], config: ReadConfig, exact_bytes: int) -> tuple[int | None, bool]:
    """(rows of the input, exact?). JSON Lines are counted line by line while they total at most
    ``exact_bytes``, else estimated from the first shard's rows per byte; gzip files that large
    leave the total unknown (None). Parquet row counts come from the file metadata."""
    jsonl = [s for s in shards if s.max_rows is None and s.kind in ("jsonl", "jsonl.gz")]
    count_lines = sum(s.end - s.start for s in jsonl) <= exact_bytes
    if not count_lines and any(s.kind == "jsonl.gz" for s in jsonl):
        return None, False
    per_byte = _jsonl_rows_per_byte(jsonl[0], config) if jsonl and not count_lines else 0.0
    total = 0
    for shard in shards:
        if shard.max_rows is not None:
            total += shard.max_rows
        elif shard.kind == "parquet":
            total += _parquet_rows_in(shard)
        elif shard.kind == "unsupported":
            total += 1
        elif count_lines:
            total += sum(1 for _ in _jsonl_lines(shard, config.read_block_bytes))
        else:
            total += round((shard.end - shard.start) * per_byte)
    return total, count_lines or not jsonl
