"""The live progress line: counter actor, driver side, rendering, and the input's row count."""

import gzip
import io as stdio
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from pipelines import reader
from pipelines.progress import ProgressConfig, ProgressCounter, ProgressLine, render

from .helpers import jsonl, wait_for


def test_render_has_done_total_rate_and_eta():
    assert render(30, 120, True, 1.5, 75) == "extract: 30/120 rows (25%), 1.50 rows/s, ETA 1m00s, 1m15s elapsed"
    assert render(0, 120, True, None, 12) == "extract: 0/120 rows (0%), starting (loading the model), 12s elapsed"
    assert render(5, 9000, False, 0.5, 3) == "extract: 5/~9000 rows (0%), 0.50 rows/s, ETA ~4h59m, 3s elapsed"
    assert render(7, None, False, 2.0, 3) == "extract: 7 rows, 2.00 rows/s, 3s elapsed"
    assert render(0, 40, True, 0.0, 30, decoding=40) == "extract: 0/40 rows (0%), 0.00 rows/s, 40 being decoded, 30s elapsed"
    # decoded chunks waiting for their writers (S3, many categories a chunk): the line said 100% for
    # a minute while 10% of the chunks were committed (helper-51, session 56)
    assert (render(400, 400, True, 5.0, 86, committed=40)
            == "extract: 400/400 rows (100%), 5.00 rows/s, 40 committed (10%), 1m26s elapsed")
    assert render(400, 400, True, 5.0, 86, committed=400) == "extract: 400/400 rows (100%), 5.00 rows/s, 1m26s elapsed"


class Tty(stdio.StringIO):
    def isatty(self):
        return True


def test_line_counts_products_inside_chunks_and_committed_rows_once(ray_cluster, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([{"product_id": str(i)} for i in range(50)]))
    read = reader.ReadConfig(uri=str(source))
    counter = ProgressCounter.remote()
    ray.get(counter.snapshot.remote())  # the actor is up
    stream = stdio.StringIO()
    line = ProgressLine(counter, reader.plan_shards(read), read, previous_rows=10, stream=stream,
                        config=ProgressConfig(log_seconds=0.2))
    line.start()
    try:
        counter.start.remote("a", 20)
        counter.add.remote("a", 8)  # 8 products of chunk a decoded, a not committed yet
        counter.start.remote("b", 20)
        counter.add.remote("b", 4)
        counter.start.remote("b", 20)  # b retried: starts again from zero
        counter.add.remote("b", 2)
        first = line.line()  # 10 earlier + 8 + 2 decoded; 12 + 18 still being decoded
        assert first.startswith("extract: 20/50 rows (40%), ") and ", 30 being decoded, " in first
        line.committed_chunk("a", 20)  # a committed: its 20 rows replace its 8 decoded products
        second = line.line()
        assert second.startswith("extract: 32/50 rows (64%), ") and ", 18 being decoded, " in second
        wait_for(lambda: "extract: 32/50" in stream.getvalue(), "the thread's line")
    finally:
        line.stop()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and lines[-1].startswith("extract: 32/50 rows")  # a log: one line each time
    chunks, _ = ray.get(counter.snapshot.remote())
    assert set(chunks) == {"b"}  # the counter forgot the committed chunk
    counter.add.remote("a", 5)  # a late report of a committed chunk counts nothing
    assert line.line().startswith("extract: 32/50 rows")
    counter.start.remote("a", 20)  # nor does a late start of it (a task run again after its commit)
    counter.add.remote("a", 3)
    assert line.line().startswith("extract: 32/50 rows") and ", 18 being decoded, " in line.line()
    wait_for(lambda: set(ray.get(counter.snapshot.remote())[0]) == {"b"}, "the counter forgetting it again")


def test_a_known_total_is_used_and_nothing_is_counted(ray_cluster, tmp_path, monkeypatch):
    """The job passes the id index's row count; the input is not read again for the line."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([{"product_id": str(i)} for i in range(5)]))
    read = reader.ReadConfig(uri=str(source))

    def refuse(*_):
        raise AssertionError("count_rows called with a known total")

    monkeypatch.setattr(reader, "count_rows", refuse)
    counter = ProgressCounter.remote()
    line = ProgressLine(counter, reader.plan_shards(read), read, previous_rows=0, stream=stdio.StringIO(), total=123)
    line.start()
    try:
        assert line.line().startswith("extract: 0/123 rows (0%)")
    finally:
        line.stop()


def test_on_a_terminal_the_line_is_rewritten_in_place(ray_cluster, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([{"product_id": "x"}]))
    read = reader.ReadConfig(uri=str(source))
    stream = Tty()
    line = ProgressLine(ProgressCounter.remote(), reader.plan_shards(read), read, 0, stream, ProgressConfig(tty_seconds=0.05))
    line.start()
    line.committed_chunk("a", 1)
    line.stop()
    text = stream.getvalue()
    assert re.fullmatch(r"(\r\x1b\[Kextract: [01]/1 rows [^\n]*)+ elapsed\n", text)
    assert "1/1 rows (100%)" in text.rsplit("\r", 1)[-1]


def test_row_counts_exact_and_estimated(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(jsonl([{"n": i} for i in range(30)]) + b"\n\n")  # blank lines skipped
    (tmp_path / "in" / "b.jsonl.gz").write_bytes(gzip.compress(jsonl([{"n": i} for i in range(5)])))
    pq.write_table(pa.table({"n": list(range(7))}), tmp_path / "in" / "c.parquet")
    (tmp_path / "in" / "d.csv").write_text("x\n")
    read = reader.ReadConfig(uri=str(tmp_path / "in"))
    shards = reader.plan_shards(read)
    assert reader.count_rows(shards, read, exact_bytes=1 << 20) == (30 + 5 + 7 + 1, True)
    limited = reader.ReadConfig(uri=str(tmp_path / "in"), limit=33)
    assert reader.count_rows(reader.plan_shards(limited), limited, exact_bytes=1) == (33, True)
    big = tmp_path / "big.jsonl"
    big.write_bytes(jsonl([json.dumps({"n": i}) for i in range(1000)]))
    read = reader.ReadConfig(uri=str(big), shard_bytes=4096, read_block_bytes=1024)
    total, exact = reader.count_rows(reader.plan_shards(read), read, exact_bytes=100)
    assert not exact and 900 <= total <= 1100  # estimated from the first block's rows per byte
    assert reader.count_rows(reader.plan_shards(read), read, exact_bytes=1 << 20) == (1000, True)


def test_has_rows(tmp_path):
    empty, blank, one = tmp_path / "e.jsonl", tmp_path / "b.jsonl", tmp_path / "o.jsonl"
    empty.write_bytes(b"")
    blank.write_bytes(b"\n  \n")
    one.write_bytes(b'{"a": 1}\n')
    for path, expected in ((empty, False), (blank, False), (one, True)):
        read = reader.ReadConfig(uri=str(path))
        assert reader.has_rows(reader.plan_shards(read), read) is expected
