"""The ownership rule: decided per hash partition (fast) equals one loop over the input (reference);
slotted files give back exactly the slots asked for; intervals respect their bound."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines import dedup
from pipelines.dedup import Verdict
from pipelines.idindex import cut
from pipelines.idruns import FINE_PARTITIONS, fine_partitions, id_hash, read_slots, write_slotted
from pipelines.idtasks import id_run, ranges

IDS = ["a", "b", "B", "a ", "é", "\x00x", "😀", "p0000000001", "x" * 300]

input_rows = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(IDS), st.booleans()), max_size=60)


def _table(rows: list[tuple[int, int, str, bool]]) -> pa.Table:
    columns = list(zip(*rows)) if rows else [[], [], [], []]
    shards, positions, ids, valid = columns
    return pa.table([pa.array(ids, pa.string()), pa.array([id_hash(i) for i in ids], pa.uint64()),
                     pa.array(shards, pa.int32()), pa.array(positions, pa.int64()), pa.array(valid, pa.bool_())],
                    schema=dedup.ID_ROWS_SCHEMA)


@settings(max_examples=200, deadline=None)
@given(input_rows, st.sets(st.sampled_from(IDS), max_size=4), st.integers(1, 5), st.randoms())
def test_decided_per_partition_equals_the_reference(drawn, existing, partitions, rng):
    rows, next_row = [], {}
    for shard, product_id, valid in drawn:  # rows of a shard numbered in order
        next_row[shard] = next_row.get(shard, -1) + 1
        rows.append((shard, next_row[shard], product_id, valid))
    shuffled = rows[:]
    rng.shuffle(shuffled)  # the order rows reach a partition does not matter
    table = _table(shuffled)
    found, held = {}, set()
    for part in range(partitions):
        mine = pa.array(np.asarray(table["hash"], dtype=np.uint64) % partitions == part)
        own_existing = pa.array([i for i in existing if id_hash(i) % partitions == part], pa.string())
        verdicts, done = dedup.decide(table.filter(mine), own_existing)
        found.update({(v["shard"], v["row"]): Verdict(v["verdict"]) for v in verdicts.to_pylist()})
        assert len(done.column("product_id").to_pylist()) == len(set(done.column("product_id").to_pylist()))
        held |= set(done.column("product_id").to_pylist())
    assert found == dedup.decide_reference(rows, existing)
    assert held == {product_id for _, _, product_id, valid in rows if valid} - existing  # ids of valid rows only


def test_reference_rule_by_example():
    rows = [(1, 0, "a", True), (0, 5, "a", False), (0, 7, "a", True), (0, 9, "b", True), (2, 0, "b", True),
            (2, 1, "c", True)]
    assert dedup.decide_reference(rows, {"c"}) == {
        (1, 0): Verdict.DUPLICATE,  # shard 0 row 7 comes first; shard 0 row 5 is invalid and owns nothing
        (2, 0): Verdict.DUPLICATE,
        (2, 1): Verdict.EXISTING,
    }


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=80), st.integers(0, 10), st.integers(0, 10))
def test_a_slot_range_reads_back_exactly_those_rows(tmp_path_factory, slots_of_rows, lo, width):
    uri = str(tmp_path_factory.mktemp("slots") / "file.arrow")
    slots = np.array(slots_of_rows, dtype=np.int64)
    table = pa.table({"value": pa.array(range(len(slots)), pa.int64())})
    counts, offsets = write_slotted(uri, table, slots, 10)
    hi = min(lo + width, 10)
    lo = min(lo, hi)
    got = read_slots(uri, offsets[lo], offsets[hi], table.schema).column("value").to_pylist()
    assert counts == [int((slots == s).sum()) for s in range(10)]
    assert got == [i for s in range(lo, hi) for i in range(len(slots)) if slots[i] == s]  # by slot, stable


def test_slotted_file_on_s3(s3_server):
    bucket = s3_server.make_bucket("slots")
    uri = f"s3://{bucket}/runs/file.arrow"
    table = pa.table({"product_id": ["p1", "p2", "p3", "p4"]})
    counts, offsets = write_slotted(uri, table, np.array([2, 0, 2, 1]), 3)
    assert counts == [1, 1, 2]
    assert read_slots(uri, offsets[1], offsets[3], table.schema).column("product_id").to_pylist() == ["p4", "p1", "p3"]
    assert read_slots(uri, offsets[0], offsets[0], table.schema).num_rows == 0


def test_fine_partitions_cut_the_hash_space_in_order():
    hashes = pa.array([0, (1 << 52) - 1, 1 << 52, (1 << 64) - 1], pa.uint64())
    assert fine_partitions(hashes).tolist() == [0, 0, 1, FINE_PARTITIONS - 1]


@pytest.mark.parametrize("limit", [1, 5, 100])
def test_intervals_cover_every_fine_partition_within_the_bound(limit):
    counts = np.random.default_rng(limit).integers(0, 7, FINE_PARTITIONS)
    intervals = cut(counts, limit)
    assert intervals[0][0] == 0 and intervals[-1][1] == FINE_PARTITIONS
    assert all(a[1] == b[0] for a, b in zip(intervals, intervals[1:]))
    for lo, hi in intervals:
        assert counts[lo:hi].sum() <= limit or (counts[lo:hi] > 0).sum() == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), max_size=40, unique=True), st.data())
def test_an_id_file_read_by_any_interval_gives_exactly_its_ids_there(tmp_path_factory, ids, data):
    """An output's id file covers fine partitions [lo, hi); a later run's interval [a, b) reads the
    byte range of their overlap and gets exactly the ids there."""
    hashes = [id_hash(i) for i in ids]
    fine = fine_partitions(pa.array(hashes, pa.uint64()))
    edges = st.sampled_from(sorted({0, FINE_PARTITIONS, *fine.tolist(), *(fine + 1).tolist()}))  # cut near ids
    lo, hi = sorted(data.draw(st.lists(edges, min_size=2, max_size=2, unique=True)))
    kept = [i for i, f in zip(ids, fine) if lo <= f < hi]
    table = pa.table([pa.array(kept, pa.string()), pa.array([id_hash(i) for i in kept], pa.uint64())],
                     schema=dedup.DONE_IDS_SCHEMA)
    uri = str(tmp_path_factory.mktemp("ids") / "ids.arrow")
    counts, offsets = write_slotted(uri, table, fine_partitions(table["hash"]), FINE_PARTITIONS)
    run = id_run(uri, lo, hi, counts[lo:hi], offsets[lo : hi + 1])
    a, b = sorted(data.draw(st.lists(edges, min_size=2, max_size=2, unique=True)))
    got = [x for part in ranges([run], a, b) for x in read_slots(*part, dedup.DONE_IDS_SCHEMA)["product_id"].to_pylist()]
    assert sorted(got) == sorted(i for i, f in zip(ids, fine) if max(lo, a) <= f < min(hi, b))
    assert run.counts[a:b].sum() == len(got)
