"""Hash partitions of product ids, and the slotted files the id index (pipelines/idindex.py) moves them in.

Hash space. Every product id has a 64-bit hash (BLAKE2b of its UTF-8, the same in every process).
Its top ``FINE_BITS`` bits are its *fine partition* (one of ``FINE_PARTITIONS``), so a range of fine
partitions ``[lo, hi)`` is one interval of the hash space, ``[lo << SHIFT, hi << SHIFT)``. The index
cuts the hash space into such intervals of about the same number of ids each.

Slotted file. A table split into numbered *slots* (fine partitions, or shards), stored as Arrow IPC
record-batch messages back to back, one per non-empty slot, in slot order, with no schema message.
The writer returns the byte offset where every slot starts (``offsets[slot]``, and the end as
``offsets[slots]``), so a reader gets any run of consecutive slots with ONE ranged read (a single GET on
S3) and decodes it by putting the schema message in front. Files are written whole (``io.write_bytes``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from pipelines import io

FINE_BITS = 12
FINE_PARTITIONS = 1 << FINE_BITS
SHIFT = 64 - FINE_BITS
HASH_SPACE = 1 << 64


def id_hash(product_id: str) -> int:
    """The product id's 64-bit hash (unsigned)."""
    return int.from_bytes(hashlib.blake2b(product_id.encode("utf-8"), digest_size=8).digest(), "big")


def fine_partitions(hashes: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Fine partition of each hash (its top FINE_BITS bits)."""
    return (np.asarray(hashes, dtype=np.uint64) >> np.uint64(SHIFT)).astype(np.int64)


def hash_interval(lo: int, hi: int) -> tuple[int, int]:
    """The hash interval [start, end) of fine partitions [lo, hi)."""
    return lo << SHIFT, hi << SHIFT


def write_slotted(uri: str, table: pa.Table, slot_of_row: np.ndarray, slots: int) -> tuple[list[int], list[int]]:
    """Write ``table`` grouped by slot; return (rows per slot, byte offset of every slot and the end)."""
    order = np.argsort(slot_of_row, kind="stable")
    grouped = table.take(pa.array(order))
    starts = np.searchsorted(slot_of_row[order], np.arange(slots + 1))  # first row of each slot
    messages, offsets, position = [], [0], 0
    for slot in range(slots):
        if starts[slot + 1] > starts[slot]:
            part = grouped.slice(starts[slot], starts[slot + 1] - starts[slot]).combine_chunks()
            messages.append(part.to_batches()[0].serialize())
            position += messages[-1].size
        offsets.append(position)
    io.write_bytes(uri, b"".join(message.to_pybytes() for message in messages))
    return np.diff(starts).tolist(), offsets


def read_slots(uri: str, start: int, end: int, schema: pa.Schema) -> pa.Table:
    """The rows of the slots stored in bytes [start, end) of a slotted file (one ranged read)."""
    if end <= start:
        return schema.empty_table()
    fs, path = io.filesystem(uri)
    with fs.open_input_file(path) as file:
        data = file.read_at(end - start, start)
    return pa.ipc.open_stream(pa.py_buffer(schema.serialize().to_pybytes() + data)).read_all()
