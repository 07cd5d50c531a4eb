"""The CPU stage before the model: read a shard, validate, deduplicate and stack, one chunk at a time.

Which rows are duplicates or already done (--skip-existing) was decided before the pipeline started,
by the id index (pipelines/idindex.py); each shard reads its own verdicts, one byte per row.

Each chunk leaves as ONE row (its rows packed as Arrow IPC bytes in ``payload``), so that later
stages, whatever batch size Ray gives them, always see whole chunks: a chunk is written and
committed as a unit. Rows that fail here are marked rejected (reason, stage) and ride along to the
writer; nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipelines import io, reader
from pipelines.commit import chunk_key, mark_shard_read
from pipelines.dedup import Verdict
from pipelines.idindex import START_OVER, InputChangedError, from_json, shard_verdicts
from pipelines.schema import Accepted, AttributeSchema, ValidationConfig, record_id, validate_record
from pipelines.stacking import NO_STACK, StackingConfig, assign_stacks

OK, REJECTED, SKIPPED = "ok", "rejected", "skipped"
UNHELD_STAGES = ("read", "validate")  # rows rejected here hold no product id for later --skip-existing runs

PREPARED_SCHEMA = pa.schema(
    [
        ("row", pa.int64()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("stage", pa.string()),
        ("record", pa.string()),  # the original record as JSON text
        ("product_id", pa.string()),  # set whenever the record has a string product_id
        ("category", pa.string()),  # set for rows that passed validation
        ("title", pa.string()),
        ("description", pa.string()),
        ("features", pa.list_(pa.string())),
        ("input_truncated", pa.bool_()),
        ("stack", pa.int32()),
    ]
)
CHUNK_SCHEMA = pa.schema(
    [
        ("chunk", pa.string()),
        ("shard", pa.string()),
        ("index", pa.int64()),
        ("rows_in", pa.int64()),
        ("payload", pa.binary()),
    ]
)


@dataclass(frozen=True)
class PrepareConfig:
    """What the prepare stage needs, and only that."""

    read: reader.ReadConfig
    validation: ValidationConfig
    stacking: StackingConfig
    schema: AttributeSchema
    output_uri: str
    skip_existing: bool = False  # --skip-existing is on (informational: the id index marks the rows it skips)


def _row(record: reader.RawRecord, status: str, reason=None, stage=None, accepted: Accepted | None = None) -> dict:
    row = {
        "row": record.row,
        "status": status,
        "reason": reason,
        "stage": stage,
        "record": record.text,
        "product_id": record_id(record.value),
        "category": None,
        "title": None,
        "description": None,
        "features": None,
        "input_truncated": False,
        "stack": NO_STACK,
    }
    if accepted is not None:
        product = accepted.product
        row.update(
            product_id=product.product_id,
            category=accepted.category,
            title=product.title,
            description=product.description,
            features=list(product.features),
            input_truncated=accepted.input_truncated,
        )
    return row


def prepare_chunk(records: list[reader.RawRecord], config: PrepareConfig, verdicts: np.ndarray) -> list[dict]:
    """Rows of one chunk in PREPARED_SCHEMA order: skipped, validated, deduplicated, stacked.

    ``verdicts[row]``: the id index's Verdict for each row of the shard (pipelines/dedup.py).
    """
    rows = []
    for record in records:
        if record.row >= len(verdicts):
            raise InputChangedError(f"row {record.row} is past the {len(verdicts)} rows the id index counted in this "
                                    f"shard: the input changed since the job started; {START_OVER}")
        verdict = verdicts[record.row]
        if record.error is not None:
            rows.append(_row(record, REJECTED, record.error, "read"))
        elif verdict == Verdict.EXISTING:
            rows.append(_row(record, SKIPPED, "already in an earlier output", "skip-existing"))
        elif isinstance(checked := validate_record(record.value, config.schema, config.validation), Accepted):
            if verdict == Verdict.DUPLICATE:
                rows.append(_row(record, REJECTED, "duplicate product_id", "dedup", checked))
            else:
                rows.append(_row(record, OK, accepted=checked))
        else:
            rows.append(_row(record, REJECTED, checked.reason, "validate"))
    categories = [row["category"] if row["status"] == OK else None for row in rows]
    for row, stack in zip(rows, assign_stacks(categories, config.stacking)):
        row["stack"] = stack
    return rows


def prepare_shards(batch: pa.Table, config: PrepareConfig) -> Iterator[pa.Table]:
    """Prepare stage (a Ray Data generator UDF): one output row per uncommitted chunk. Each chunk,
    committed ones too, must read as it did when the id index was built (``ShardIndex.digests``):
    else the input changed under the job, and neither the index's verdicts (by row position) nor
    the committed chunks fit it. Indexes from before 2026-11-29 keep no digests: their committed
    chunks are passed over unread, as then."""
    for shard_row in batch.to_pylist():
        skip = frozenset(shard_row.pop("skip"))
        index = from_json(shard_row.pop("index"))
        verdicts = shard_verdicts(index)
        shard = reader.Shard(**shard_row)
        unread = frozenset() if index.digests else skip
        chunks, read = 0, reader.iter_chunks(shard, config.read, unread)
        while True:
            try:
                i, records = next(read)
            except StopIteration as end:
                rows_read = end.value
                break
            chunks += 1
            if records is None:  # committed by an earlier attempt (an index without digests)
                continue
            key, digest = chunk_key(shard.shard_id, i), reader.chunk_digest(records)
            if index.digests and (i >= len(index.digests) or index.digests[i] != digest):
                raise InputChangedError(f"the rows of chunk {key} ({shard.uri}) are not those the id index read when "
                                        f"the job began: the input changed under the job; resuming would mix two "
                                        f"inputs: {START_OVER}")
            if i in skip:  # committed by an earlier attempt, and the same rows
                continue
            rows = prepare_chunk(records, config, verdicts)
            payload = io.table_to_bytes(pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA))
            chunk = {"chunk": key, "shard": shard.shard_id, "index": i, "rows_in": len(rows), "payload": payload}
            yield pa.Table.from_pylist([chunk], schema=CHUNK_SCHEMA)
        expected = min(len(verdicts), shard.max_rows or len(verdicts))
        if rows_read != expected:  # fewer: a read cut short that did not raise; never mark such a shard read
            raise RuntimeError(f"read {rows_read} rows of {shard.uri} (bytes {shard.start}-{shard.end}) where the id "
                               f"index counted {expected}: the input changed or could not be read whole (if it "
                               f"changed: {START_OVER})")  # the job adds: run the same command again to resume
        mark_shard_read(config.output_uri, shard.shard_id, chunks)
