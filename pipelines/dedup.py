"""Which rows own their product id: the rule, a fast form over one hash partition, and its slow reference.

The rule. Rows are ordered by input position: shard (in plan order: file path, then byte offset) and
row index inside the shard. With ``--skip-existing``, a row whose product id an earlier output already
has is EXISTING (skipped), whether or not it is valid. Among the other rows that pass validation, the
first of each product id owns it and every later one is a DUPLICATE (rejected with the reason). Rows
that fail validation neither own an id nor block a later valid row from owning it. The ids an output
holds (what later ``--skip-existing`` runs skip) are those of its valid rows: a product whose every
row failed validation (a missing title, say) is not held, so a corrected record is processed later.

The order is a property of the input, not of timing, so the verdicts are the same in every attempt,
retry and resume. Rows of one product id share its hash partition, so each partition is decided on
its own (``decide``), with only that partition's ids in memory. ``decide_reference`` is the rule
written as a single loop over the whole input; tests check that they agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines import reader
from pipelines.idruns import id_hash
from pipelines.schema import Accepted, AttributeSchema, ValidationConfig, record_id, validate_record


class Verdict(IntEnum):
    NONE = 0  # no objection: processed if it passes validation
    DUPLICATE = 1  # a valid row earlier in the input has this product id: rejected
    EXISTING = 2  # an earlier output has this product id (--skip-existing): skipped


# One row per input row that carries a usable product id (read by the map step).
ID_ROWS_SCHEMA = pa.schema(
    [
        ("product_id", pa.string()),
        ("hash", pa.uint64()),
        ("shard", pa.int32()),  # the shard's position in the plan
        ("row", pa.int64()),  # the row's index in its shard
        ("valid", pa.bool_()),  # passes validation (only valid rows can own an id)
    ]
)
VERDICTS_SCHEMA = pa.schema([("shard", pa.int32()), ("row", pa.int64()), ("verdict", pa.int8())])
DONE_IDS_SCHEMA = pa.schema([("product_id", pa.string()), ("hash", pa.uint64())])  # ids an output has


def id_rows(
    shard: int, records: list[reader.RawRecord], schema: AttributeSchema, validation: ValidationConfig
) -> pa.Table:
    """ID_ROWS_SCHEMA rows of one chunk: its records that carry a usable product id."""
    ids, hashes, rows, valid = [], [], [], []
    for record in records:
        product_id = record_id(record.value) if record.error is None else None
        if product_id is None:
            continue
        ids.append(product_id)
        hashes.append(id_hash(product_id))
        rows.append(record.row)
        valid.append(isinstance(validate_record(record.value, schema, validation), Accepted))
    columns = [ids, hashes, np.full(len(ids), shard, dtype=np.int32), rows, valid]
    return pa.table([pa.array(c, f.type) for c, f in zip(columns, ID_ROWS_SCHEMA)], schema=ID_ROWS_SCHEMA)


def decide(rows: pa.Table, existing: pa.Array | pa.ChunkedArray) -> tuple[pa.Table, pa.Table]:
    """Verdicts for the rows of one hash partition (all rows of their ids, from every shard).

    ``existing``: product ids of earlier outputs in this partition. Returns (the rows with a verdict
    other than NONE, VERDICTS_SCHEMA; the ids this output will hold, DONE_IDS_SCHEMA, unique).
    """
    if len(existing):
        skipped = pc.fill_null(pc.is_in(rows["product_id"], value_set=pc.unique(existing)), False)
    else:
        skipped = pa.array(np.zeros(rows.num_rows, dtype=bool))
    candidates = rows.filter(pc.and_(rows["valid"], pc.invert(skipped)))
    candidates = candidates.sort_by([("product_id", "ascending"), ("shard", "ascending"), ("row", "ascending")])
    ids = candidates["product_id"].combine_chunks()
    later = np.zeros(len(ids), dtype=bool)  # same id as the row before it in (id, shard, row) order
    if len(ids) > 1:
        later[1:] = pc.equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)
    duplicates = candidates.filter(pa.array(later))
    existing_rows = rows.filter(skipped)
    verdicts = pa.concat_tables(
        [
            _verdicts(duplicates, Verdict.DUPLICATE),
            _verdicts(existing_rows, Verdict.EXISTING),
        ]
    )
    held = pc.and_(rows["valid"], pc.invert(skipped))  # not an id only invalid rows carried
    done = rows.filter(held).select(["product_id", "hash"]).group_by(["product_id", "hash"]).aggregate([])
    return verdicts, done.select(["product_id", "hash"]).cast(DONE_IDS_SCHEMA)


def _verdicts(rows: pa.Table, verdict: Verdict) -> pa.Table:
    values = np.full(rows.num_rows, int(verdict), dtype=np.int8)
    return pa.table([rows["shard"], rows["row"], values], schema=VERDICTS_SCHEMA)


def decide_reference(rows: Iterable[tuple[int, int, str, bool]], existing: set[str]) -> dict[tuple[int, int], Verdict]:
    """The rule as one loop in input order: (shard, row, product_id, valid) -> verdicts other than NONE."""
    seen, verdicts = set(), {}
    for shard, row, product_id, valid in sorted(rows):
        if product_id in existing:
            verdicts[shard, row] = Verdict.EXISTING
        elif valid and product_id in seen:
            verdicts[shard, row] = Verdict.DUPLICATE
        elif valid:
            seen.add(product_id)
    return verdicts
