"""Exactly-once accounting of one chunk, checked by row identity before the chunk is committed.

A row's identity is its index in its shard (``RawRecord.row``), set by the reader and carried
through prepare and extract. The extract stage hands the writer a ledger: the rows read for the
chunk (with their product ids) and the rows it wrote, rejected and skipped. Before it writes the
commit manifest, the writer checks the ledger against itself and against the tables it is about to
write:

- every row read leaves the chunk exactly once: written, rejected or skipped (none missing, none
  twice, none that was not read);
- the attribute rows are those of the written rows' products, each (product, attribute) once;
- the rejected table has one row per rejected row; the counters agree with the ledger.

Counts alone can cancel (one row dropped, another duplicated); identities cannot. A chunk that
fails the check is not committed: its task fails and the job stops with the message (Ray Data
does not retry an error the task raises; a resume does the chunk again).
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa


class AccountingError(RuntimeError):
    """A chunk's rows do not add up; it must not be committed."""


def _sample(items) -> str:
    items = sorted(items, key=str)
    return ", ".join(map(str, items[:5])) + (f" and {len(items) - 5} more" if len(items) > 5 else "")


def problems(ledger: dict, stats: dict, attributes: pa.Table, rejected: pa.Table) -> list[str]:
    """What is wrong with one chunk's ledger and tables (empty when it adds up)."""
    found = []
    read = ledger["read_rows"]
    product_of = dict(zip(read, ledger["read_ids"]))
    if len(set(read)) != len(read):
        found.append(f"rows read twice: {_sample(r for r, n in Counter(read).items() if n > 1)}")
    out = Counter(ledger["written_rows"]) + Counter(ledger["rejected_rows"]) + Counter(ledger["skipped_rows"])
    if missing := set(read) - set(out):
        found.append(f"rows neither written, rejected nor skipped: {_sample(missing)}")
    if twice := [row for row, n in out.items() if n > 1]:
        found.append(f"rows that left the chunk more than once: {_sample(twice)}")
    if unknown := set(out) - set(read):
        found.append(f"rows that were not read: {_sample(unknown)}")

    written_ids = [product_of.get(row) for row in ledger["written_rows"]]
    table_ids = set(attributes.column("product_id").to_pylist())
    if extra := table_ids - set(written_ids):
        found.append(f"attribute rows of products not written: {_sample(extra)}")
    if absent := set(written_ids) - table_ids:
        found.append(f"written products without attribute rows: {_sample(absent)}")
    pairs = Counter(zip(attributes.column("product_id").to_pylist(), attributes.column("attribute").to_pylist()))
    if repeated := [pair for pair, n in pairs.items() if n > 1]:
        found.append(f"(product, attribute) rows written more than once: {_sample(repeated)}")
    if rejected.num_rows != len(ledger["rejected_rows"]):
        found.append(f"{rejected.num_rows} rejected rows in the table, {len(ledger['rejected_rows'])} in the ledger")

    expected = {
        "rows_in": len(read),
        "products_out": len(ledger["written_rows"]),
        "rejected": len(ledger["rejected_rows"]),
        "skipped": len(ledger["skipped_rows"]),
        "attribute_rows": attributes.num_rows,
    }
    if wrong := {name: (stats.get(name), n) for name, n in expected.items() if stats.get(name) != n}:
        found.append("counters disagree with the rows (counter, rows): " + ", ".join(f"{k} {v}" for k, v in wrong.items()))
    return found


def check_chunk(chunk: str, ledger: dict, stats: dict, attributes: pa.Table, rejected: pa.Table) -> None:
    """Raise AccountingError naming what is wrong, if anything."""
    if found := problems(ledger, stats, attributes, rejected):
        raise AccountingError(f"chunk {chunk}: rows do not add up, not committing it: " + "; ".join(found))
