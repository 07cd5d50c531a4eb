"""The id index's Ray tasks (pipelines/idindex.py plans them): map a shard, map earlier manifests, reduce an interval.

Each task reads and writes whole files under the index's build directory, holds at most
``limit`` id rows at a time (a reduce task: its interval's), and returns only small metadata: row
counts and byte offsets per fine partition, or per shard. Writes are deterministic (same input, same
bytes), so a retried task rewrites what it wrote before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import ray

from pipelines import dedup, io, reader
from pipelines.idruns import FINE_PARTITIONS, SHIFT, fine_partitions, id_hash, read_slots, write_slotted

if TYPE_CHECKING:  # prepare imports idindex, which imports this module
    from pipelines.prepare import PrepareConfig


@dataclass(frozen=True)
class Run:
    uri: str
    counts: np.ndarray  # ids per fine partition
    offsets: np.ndarray  # byte offset of each fine partition's slot, and the end


class _RunWriter:
    """Collects id tables and writes them as runs of at least ``limit`` rows (slotted by fine partition)."""

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


def map_shard(shard: reader.Shard, ordinal: int, prepare: PrepareConfig, build: str, limit: int) -> dict:
    """Map step of one shard: read it as the prepare stage will, write its id rows as runs."""
    writer, rows = _RunWriter(io.join(build, "map", f"{ordinal:06d}"), limit), 0
    for _, records in reader.iter_chunks(shard, prepare.read):
        rows += len(records)
        writer.add(dedup.id_rows(ordinal, records, prepare.schema, prepare.validation))
    return {"rows": rows, "runs": writer.flush()}


def map_manifests(number: int, manifests: list[str], build: str, limit: int) -> list[Run]:
    """Map step of an earlier output without an index: the ids of its committed chunks (owned and rejected)."""
    writer = _RunWriter(io.join(build, "map", f"earlier-{number:06d}"), limit)
    for uri in manifests:
        manifest = io.read_json(uri)
        ids = manifest["owned_ids"] + manifest["rejected_ids"]
        writer.add(pa.table([ids, pa.array([id_hash(i) for i in ids], pa.uint64())], schema=dedup.DONE_IDS_SCHEMA))
    return writer.flush()


def reduce_interval(
    number: int, lo: int, hi: int, inputs: list, earlier_runs: list, earlier_files: list, shards: int, build: str
) -> dict:
    """Reduce step of fine partitions [lo, hi): decide their rows, write verdicts (by shard) and held ids."""
    start, end = lo << SHIFT, hi << SHIFT
    rows = _concat([read_slots(*part, dedup.ID_ROWS_SCHEMA) for part in inputs], dedup.ID_ROWS_SCHEMA)
    existing = [read_slots(*part, dedup.DONE_IDS_SCHEMA)["product_id"] for part in earlier_runs]
    for uri in earlier_files:  # an earlier output's id file: keep the ids in this interval
        ids = io.table_from_bytes(io.read_bytes(uri))
        hashes = ids["hash"].to_numpy()
        existing.append(ids["product_id"].filter(pa.array((hashes >= start) & (hashes < end))))  # chunked
    existing = pa.chunked_array([chunk for column in existing for chunk in column.chunks], pa.string())
    verdicts, done = dedup.decide(rows, existing)
    result = {"verdicts": None, "slots": [], "ids": None, "ids_count": done.num_rows,
              "duplicates": int((verdicts["verdict"].to_numpy() == dedup.Verdict.DUPLICATE).sum())}
    result["existing"] = verdicts.num_rows - result["duplicates"]
    if verdicts.num_rows:
        result["verdicts"] = f"verdicts/{number:06d}.arrow"
        counts, offsets = write_slotted(io.join(build, result["verdicts"]), verdicts,
                                        verdicts["shard"].to_numpy(), shards)
        result["slots"] = [(s, offsets[s], offsets[s + 1]) for s in range(shards) if counts[s]]
    if done.num_rows:
        result["ids"] = f"ids/{number:06d}.arrow"
        io.write_bytes(io.join(build, result["ids"]), io.table_to_bytes(done))
    return result


def ranges(runs: list[Run], lo: int, hi: int) -> list[tuple[str, int, int]]:
    """(uri, start, end) of fine partitions [lo, hi) in each run that has ids there."""
    return [(run.uri, int(run.offsets[lo]), int(run.offsets[hi])) for run in runs if run.offsets[hi] > run.offsets[lo]]


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else schema.empty_table()


MAP_SHARD = ray.remote(map_shard)
MAP_MANIFESTS = ray.remote(map_manifests)
REDUCE_INTERVAL = ray.remote(reduce_interval)
