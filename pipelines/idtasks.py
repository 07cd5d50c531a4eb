"""The id index's Ray tasks (pipelines/idindex.py plans them): map a group of shards, map earlier
manifests, reduce an interval, gather a group's verdicts.

Each task reads and writes whole files under the index's build directory, holds about ``limit`` id
rows at most (a map task: ``limit`` plus one chunk; a reduce task: its interval's), and returns only
small metadata: row counts and byte offsets per fine partition, or per shard. A retried task writes
the same rows to the same files again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import ray

from pipelines import dedup, io, reader
from pipelines.idruns import FINE_PARTITIONS, fine_partitions, id_hash, read_slots, write_slotted

if TYPE_CHECKING:  # prepare imports idindex, which imports this module
    from pipelines.prepare import PrepareConfig


@dataclass(frozen=True)
class Run:
    """A slotted file of ids, one slot per fine partition: a map task's run, or an output's id file."""

    uri: str
    counts: np.ndarray  # ids per fine partition
    offsets: np.ndarray  # byte offset of each fine partition's slot, and the end


class _RunWriter:
    """Collects id tables (a chunk's each) and writes a run as soon as it holds ``limit`` rows or more."""

    def __init__(self, prefix: str, limit: int) -> None:
        self.prefix, self.limit, self.pending, self.rows, self.runs = prefix, limit, [], 0, []

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.rows += table.num_rows
        if self.rows >= self.limit:
            self.flush()

    def flush(self) -> list[Run]:
        if self.rows:
            table = pa.concat_tables(self.pending)
            uri = f"{self.prefix}-{len(self.runs):04d}.arrow"
            counts, offsets = write_slotted(uri, table, fine_partitions(table["hash"]), FINE_PARTITIONS)
            self.runs.append(Run(uri, np.array(counts, np.int64), np.array(offsets, np.int64)))
        self.pending, self.rows = [], 0
        return self.runs


def _release() -> None:
    """Hand the task's freed Arrow memory back to the system: the worker process lives on (idle, or
    running pipeline tasks) and would otherwise keep its peak."""
    pa.default_memory_pool().release_unused()


def map_shards(group: list[tuple[int, reader.Shard]], prepare: PrepareConfig, build: str, limit: int) -> dict:
    """Map step of a group of shards ((ordinal, shard) pairs, idindex.map_groups): read each as the
    prepare stage will, write their id rows together as runs (a run holds rows of several shards, each
    row naming its own). Returns each shard's row count and chunks' digests, and the runs."""
    writer, rows = _RunWriter(io.join(build, "map", f"{group[0][0]:06d}"), limit), []
    for ordinal, shard in group:
        count, digests = 0, []
        for _, records in reader.iter_chunks(shard, prepare.read):
            count += len(records)
            digests.append(reader.chunk_digest(records))
            writer.add(dedup.id_rows(ordinal, records, prepare.schema, prepare.validation))
        rows.append((ordinal, count, digests))
    runs = writer.flush()
    _release()
    return {"rows": rows, "runs": runs}


def map_manifests(number: int, manifests: list[str], build: str, limit: int) -> list[Run]:
    """Map step of an earlier output without an index: the ids of its committed chunks (owned and rejected)."""
    writer = _RunWriter(io.join(build, "map", f"earlier-{number:06d}"), limit)
    for uri in manifests:
        manifest = io.read_json(uri)
        ids = manifest["owned_ids"] + manifest["rejected_ids"]
        writer.add(pa.table([ids, pa.array([id_hash(i) for i in ids], pa.uint64())], schema=dedup.DONE_IDS_SCHEMA))
    runs = writer.flush()
    _release()
    return runs


def reduce_interval(number: int, lo: int, hi: int, inputs: list, earlier: list, shards: int, build: str,
                    group_starts: list[int]) -> dict:
    """Reduce step of fine partitions [lo, hi): decide their rows; write the verdicts (slotted by shard)
    and the ids this output holds (slotted by fine partition). ``inputs``: byte ranges of input runs,
    ``earlier``: of earlier outputs' ids, as (uri, start, end). Returns where each map group's
    shards' verdicts are (``group_starts``: each group's first shard): one byte range per group."""
    rows = _concat([read_slots(*part, dedup.ID_ROWS_SCHEMA) for part in inputs], dedup.ID_ROWS_SCHEMA)
    existing = [read_slots(*part, dedup.DONE_IDS_SCHEMA)["product_id"] for part in earlier]
    existing = pa.chunked_array([chunk for column in existing for chunk in column.chunks], pa.string())
    verdicts, done = dedup.decide(rows, existing)
    duplicates = int((verdicts["verdict"].to_numpy() == dedup.Verdict.DUPLICATE).sum())
    result = {"verdicts": None, "group_offsets": None, "ids": None, "duplicates": duplicates,
              "existing": verdicts.num_rows - duplicates}
    if verdicts.num_rows:
        result["verdicts"] = f"intervals/{number:06d}.arrow"
        _, offsets = write_slotted(io.join(build, result["verdicts"]), verdicts, verdicts["shard"].to_numpy(), shards)
        result["group_offsets"] = [offsets[s] for s in [*group_starts, shards]]
    if done.num_rows:
        uri = f"ids/{number:06d}.arrow"
        counts, offsets = write_slotted(io.join(build, uri), done, fine_partitions(done["hash"]), FINE_PARTITIONS)
        result["ids"] = {"uri": uri, "lo": lo, "hi": hi, "counts": counts[lo:hi], "offsets": offsets[lo : hi + 1]}
    del rows, existing, verdicts, done
    _release()
    return result


def gather_verdicts(number: int, first: int, count: int, parts: list, build: str) -> dict:
    """The verdicts of one map group's shards ``[first, first + count)``, gathered from the intervals'
    files (``parts``: one byte range of each that has any) into one file slotted by shard, so that
    each shard's verdicts are one range of one file whatever the number of intervals. Returns its
    name and each shard's (start, end)."""
    table = _concat([read_slots(*part, dedup.VERDICTS_SCHEMA) for part in parts], dedup.VERDICTS_SCHEMA)
    uri = f"verdicts/{number:06d}.arrow"
    _, offsets = write_slotted(io.join(build, uri), table, table["shard"].to_numpy() - first, count)
    del table
    _release()
    return {"verdicts": uri, "offsets": offsets}


def id_run(uri: str, lo: int, hi: int, counts: list[int], offsets: list[int]) -> Run:
    """An output's id file as a run: its slots [lo, hi) (the others are empty)."""
    full_counts = np.zeros(FINE_PARTITIONS, np.int64)
    full_counts[lo:hi] = counts
    full_offsets = np.full(FINE_PARTITIONS + 1, offsets[-1], np.int64)
    full_offsets[: lo + 1] = offsets[0]
    full_offsets[lo : hi + 1] = offsets
    return Run(uri, full_counts, full_offsets)


def ranges(runs: list[Run], lo: int, hi: int) -> list[tuple[str, int, int]]:
    """(uri, start, end) of fine partitions [lo, hi) in each run that has ids there."""
    return [(run.uri, int(run.offsets[lo]), int(run.offsets[hi])) for run in runs if run.offsets[hi] > run.offsets[lo]]


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else schema.empty_table()


# max_calls=1: the worker of each task exits after it, so the memory of its sort is given back to
# the machine instead of being kept by an idle worker for the rest of the job
MAP_SHARDS = ray.remote(max_calls=1)(map_shards)
MAP_MANIFESTS = ray.remote(max_calls=1)(map_manifests)
REDUCE_INTERVAL = ray.remote(max_calls=1)(reduce_interval)
GATHER_VERDICTS = ray.remote(max_calls=1)(gather_verdicts)
