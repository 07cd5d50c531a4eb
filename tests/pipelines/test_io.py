import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import io, reader
from pipelines.reader import ReadConfig, iter_chunks, plan_shards


def rows_of(config: ReadConfig) -> list:
    out = []
    for shard in plan_shards(config):
        for _, records in iter_chunks(shard, config):
            out += records
    return out


lines = st.lists(st.text(alphabet="ab\n é{}", max_size=12), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines, st.integers(1, 40), st.integers(1, 7), st.booleans(), st.booleans())
def test_byte_range_shards_read_every_line_exactly_once(tmp_path, texts, shard_bytes, chunk_rows, final_newline, bom):
    path = tmp_path / "in.jsonl"
    body = "\n".join(json.dumps(t) if i % 3 else t for i, t in enumerate(texts))
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + (body + ("\n" if final_newline else "")).encode())
    expected = [line for line in path.read_bytes().removeprefix(b"\xef\xbb\xbf").split(b"\n") if line.strip()]
    config = ReadConfig(str(path), shard_bytes=shard_bytes, chunk_rows=chunk_rows, read_block_bytes=5)
    got = rows_of(config)
    assert [r.text.encode() for r in got] == [line.rstrip(b"\r") for line in expected]
    for record in got:
        assert (record.error is None) == _is_json(record.text)


def _is_json(text):
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_chunks_close_on_rows_or_bytes_and_skip_without_parsing(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"i": i, "pad": "x" * (80 if i == 1 else 1)}) + "\n" for i in range(10)))
    config = ReadConfig(str(path), chunk_rows=4, chunk_bytes=100)  # short lines are 22 bytes
    (shard,) = plan_shards(config)
    chunks = list(iter_chunks(shard, config, skip=frozenset({1})))
    sizes = [None if records is None else [r.row for r in records] for _, records in chunks]
    assert sizes == [[0, 1], None, [6, 7, 8, 9]]  # chunk 0 closed by bytes, 1 skipped, 2 by rows


def _categorised(rng_seed: int, n: int, categories: int) -> list[str]:
    import random

    rng = random.Random(rng_seed)
    lines = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.1:
            lines.append("not json")
        elif kind < 0.15:
            lines.append(json.dumps({"product_id": str(i), "category": 7}))  # not a string: no category
        else:
            lines.append(json.dumps({"product_id": str(i), "category": f"c{rng.randrange(categories)}", "pad": "x" * rng.randrange(40)}))
    return lines


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10**6), st.integers(0, 60), st.integers(1, 9), st.integers(1, 5), st.integers(1, 6))
def test_grouped_chunks_hold_every_row_once_grouped_by_category(tmp_path, seed, n, chunk_rows, group_chunks, categories):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(line + "\n" for line in _categorised(seed, n, categories)))
    config = ReadConfig(str(path), chunk_rows=chunk_rows, group_chunks=group_chunks)  # chunks close on rows here
    (shard,) = plan_shards(config)
    chunks = list(iter_chunks(shard, config))
    assert [index for index, _ in chunks] == list(range(len(chunks)))
    rows = [[r.row for r in records] for _, records in chunks]
    assert sorted(r for chunk in rows for r in chunk) == list(range(n))  # every row once
    assert all(chunk == sorted(chunk) and 0 < len(chunk) <= chunk_rows for chunk in rows)
    window = chunk_rows * group_chunks
    for start in range(0, n if group_chunks > 1 else 0, window):  # in a window, a category's rows fill consecutive chunks
        held = {index: {c for r in records if start <= r.row < start + window and isinstance(c := reader._category(r), str)}
                for index, records in chunks}
        for category in set().union(*held.values()):
            indices = [index for index, categories in held.items() if category in categories]
            for between in range(indices[0] + 1, indices[-1]):  # only it (and rows without a category) in between
                assert held[between] <= {category}, (category, indices, held)
    again = list(iter_chunks(shard, config, skip=frozenset({0, 2})))  # the same cut every time; skipped ones unparsed
    assert [None if i in (0, 2) else [r.row for r in records] for i, records in chunks] == [
        None if records is None else [r.row for r in records] for _, records in again]
    if group_chunks == 1:  # chunks of consecutive rows, as before grouping
        assert [r for chunk in rows for r in chunk] == list(range(n))


def test_records_come_in_file_order_whatever_the_grouping(tmp_path):
    categories = ["A", "B", "A", "C", "B", "A"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"product_id": str(i), "category": c}) + "\n"
                                               for i, c in enumerate(categories)))
    config = ReadConfig(str(tmp_path / "in.jsonl"), chunk_rows=2, group_chunks=3)
    records = [r for shard in plan_shards(config) for r in reader.iter_records(shard, config)]
    assert [(r.row, r.value["product_id"]) for r in records] == [(i, str(i)) for i in range(6)]
    assert [r.value["product_id"] for r in rows_of(config)] == ["0", "2", "1", "5", "3", "4"]  # grouped A A | A B | B C


def test_grouped_windows_and_chunks_close_on_bytes(tmp_path):
    path = tmp_path / "in.jsonl"  # lines of 48 bytes, categories b, a, b, a, ...
    path.write_text("".join(json.dumps({"category": "ab"[i % 2 == 0], "pad": "x" * (12 - len(str(i))), "i": i}) + "\n"
                            for i in range(10)))
    assert {len(line) for line in path.read_bytes().splitlines(keepends=True)} == {48}
    config = ReadConfig(str(path), chunk_rows=100, chunk_bytes=96, group_chunks=2)  # windows of 4 rows, chunks of 2
    (shard,) = plan_shards(config)
    rows = [[r.row for r in records] for _, records in iter_chunks(shard, config)]
    assert rows == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 9]]  # each window: its b rows, then its a rows


@pytest.mark.parametrize("chunk_bytes", [16 << 20, 300], ids=["chunks-close-on-rows", "on-bytes-too"])
def test_an_input_in_category_order_is_cut_as_consecutive_rows(tmp_path, chunk_bytes):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"product_id": str(i), "category": f"z{i // 7}" if i % 11 else 5, "pad": "x" * (i * 37 % 90)})
             for i in range(100)]
    path.write_text("".join(line + "\n" for line in lines[:40]) + "broken\n" + "".join(line + "\n" for line in lines[40:]))

    def chunks(group_chunks):
        config = ReadConfig(str(path), chunk_rows=6, chunk_bytes=chunk_bytes, group_chunks=group_chunks)
        (shard,) = plan_shards(config)
        return [[r.row for r in records] for _, records in iter_chunks(shard, config)]

    assert chunks(8) == chunks(1)


def test_windows_end_where_consecutive_chunks_end(tmp_path):
    """Chunks closed by bytes hold more than chunk_bytes; a window of G chunks ends where the G-th
    chunk of the consecutive cut ends, not at G x chunk_bytes (which fell inside a chunk and cut
    sorted input differently from consecutive rows)."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"category": f"c{i // 5}", "pad": "x" * 40}) + "\n" for i in range(20)))
    assert {len(line) for line in path.read_bytes().splitlines(keepends=True)} == {70}

    def chunks(group_chunks):
        config = ReadConfig(str(path), chunk_rows=100, chunk_bytes=100, group_chunks=group_chunks)  # 2 rows a chunk
        (shard,) = plan_shards(config)
        return [[r.row for r in records] for _, records in iter_chunks(shard, config)]

    assert chunks(1) == [[2 * i, 2 * i + 1] for i in range(10)]
    assert chunks(2) == chunks(1)  # windows of 4 rows (280 bytes), not 3 (210 >= 2 x 100)


def test_grouped_chunks_count_the_strings_of_parquet_lists(tmp_path):
    """A Parquet row's features list counts its strings in the grouped cut (the consecutive cut,
    kept for outputs started before, counts a list as 8 bytes): long features close chunks on bytes."""
    rows = [{"product_id": str(i), "category": "c", "features": ["x" * 300, "y" * 300]} for i in range(10)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")

    def chunks(group_chunks):
        config = ReadConfig(str(tmp_path / "in.parquet"), chunk_rows=100, chunk_bytes=1000, group_chunks=group_chunks)
        (shard,) = plan_shards(config)
        return [[r.row for r in records] for _, records in iter_chunks(shard, config)]

    assert chunks(1) == [list(range(10))]  # about 30 bytes a row as counted then
    assert chunks(8) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]  # about 650 bytes a row


def test_grouping_fills_chunks_with_fewer_categories(tmp_path):
    """Rows of 20 categories mixed row by row: chunks of 10 consecutive rows hold about 8 categories
    each; grouped over windows of 8 chunks, about 3."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"product_id": str(i), "category": f"c{(i * 7) % 20}"}) + "\n" for i in range(800)))

    def categories_per_chunk(group_chunks):
        config = ReadConfig(str(path), chunk_rows=10, group_chunks=group_chunks)
        (shard,) = plan_shards(config)
        chunks = [{r.value["category"] for r in records} for _, records in iter_chunks(shard, config)]
        return sum(map(len, chunks)) / len(chunks)

    assert categories_per_chunk(1) == 10 and categories_per_chunk(8) <= 3


def test_parquet_gzip_unsupported_hidden_and_limit(tmp_path):
    pq.write_table(pa.table({"product_id": ["a", "b", "c"], "n": [1, 2, 3]}), tmp_path / "1.parquet")
    with gzip.open(tmp_path / "2.jsonl.gz", "wt") as f:
        f.write('{"product_id": "d"}\n{"product_id": "e"}\n')
    (tmp_path / "3.csv").write_text("a,b\n")
    (tmp_path / "4.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".hidden.jsonl").write_text("{}\n")
    (tmp_path / "_temporary").mkdir()
    (tmp_path / "_temporary" / "x.jsonl").write_text("{}\n")
    got = rows_of(ReadConfig(str(tmp_path)))
    assert [r.value["product_id"] for r in got[:5]] == ["a", "b", "c", "d", "e"]
    assert got[0].value == {"product_id": "a", "n": 1} and json.loads(got[0].text) == got[0].value
    assert "unsupported file type (expected .parquet, .pq, .jsonl, .json, .ndjson, .jsonl.gz, .json.gz, .ndjson.gz; a CSV" in got[5].error and got[5].text == json.dumps({"file": str(tmp_path / "3.csv")})
    assert "malformed Parquet" in got[6].error
    assert len(got) == 7
    limited = rows_of(ReadConfig(str(tmp_path), limit=4))
    assert [r.value["product_id"] for r in limited] == ["a", "b", "c", "d"]


def test_a_parquet_string_that_is_not_utf8_rejects_its_row_alone(tmp_path):
    """A writer that does not check UTF-8: that row is a rejected row naming the file and row, the
    rows beside it are read (before: the whole job stopped on a UnicodeDecodeError)."""
    ids = pa.array([b"ok-1", b"caf\xe9", b"ok-3"], pa.binary()).view(pa.string())  # not validated
    pq.write_table(pa.table({"product_id": ids, "n": [1, 2, 3]}), tmp_path / "latin1.parquet")
    got = rows_of(ReadConfig(str(tmp_path / "latin1.parquet")))
    assert [r.value for r in got] == [{"product_id": "ok-1", "n": 1}, None, {"product_id": "ok-3", "n": 3}]
    assert "not UTF-8" in got[1].error and json.loads(got[1].text) == {"file": str(tmp_path / "latin1.parquet"), "row": 1}
    assert [r.row for r in got] == [0, 1, 2]


def test_a_json_line_that_is_not_utf8_says_so_and_how_to_fix_it(tmp_path):
    """A Latin-1 line in a JSON Lines file is a rejected row that names the encoding and the byte,
    not Python's codec message (a new user's walk, session 63); the lines beside it are read."""
    (tmp_path / "latin1.jsonl").write_bytes(b'{"product_id": "a"}\n{"product_id": "caf\xe9"}\n{"product_id": "c"}\n')
    got = rows_of(ReadConfig(str(tmp_path / "latin1.jsonl")))
    assert [r.value for r in got] == [{"product_id": "a"}, None, {"product_id": "c"}]
    assert got[1].error == ("the line is not UTF-8 text (byte 0xe9 at byte 19 of the line): JSON Lines are UTF-8; "
                            "re-encode the file (e.g. iconv -f latin1 -t utf-8) and run it again")


def test_a_parquet_file_that_gives_a_column_twice_rejects_each_row(tmp_path):
    """A row read as a dict would keep the last of two columns of one name: each row is rejected."""
    table = pa.Table.from_arrays([pa.array([f"p{i}" for i in range(5)]), pa.array(["Tea"] * 5), pa.array(["a"] * 5),
                                  pa.array(["b"] * 5)], names=["product_id", "category", "title", "title"])
    pq.write_table(table, tmp_path / "twice.parquet", row_group_size=2)
    config = ReadConfig(str(tmp_path / "twice.parquet"), read_block_bytes=16)
    records = [r for shard in plan_shards(config) for r in reader.iter_records(shard, config)]
    assert [(r.row, r.value, r.error) for r in records] == [
        (i, None, "a column given more than once in the file: ['title']") for i in range(5)]
    assert [json.loads(r.text)["row"] for r in records] == list(range(5))


@pytest.mark.parametrize("damage", ["cut", "not-gzip"])
def test_a_gzip_file_that_does_not_decompress_is_a_rejected_row(tmp_path, damage):
    """A .jsonl.gz cut short (a partial upload) or not gzip at all: the rest of the file is one
    rejected row with the reason (before: the job stopped on the OSError)."""
    data = gzip.compress(b'{"product_id": "a"}\n' * 5000)
    path = tmp_path / "part.jsonl.gz"
    path.write_bytes(data[: len(data) // 2] if damage == "cut" else b'{"product_id": "a"}\n')
    (tmp_path / "ok.jsonl").write_text('{"product_id": "b"}\n')
    got = rows_of(ReadConfig(str(tmp_path)))
    assert len(got) == 2 and got[0].value == {"product_id": "b"}  # the other file is read
    bad = got[1]
    assert bad.value is None and "malformed gzip file" in bad.error and json.loads(bad.text) == {"file": str(path)}
    assert reader.has_rows(plan_shards(ReadConfig(str(path))), ReadConfig(str(path)))  # preflight: a row to reject


def test_an_input_of_unsupported_files_only_is_a_clear_error(tmp_path):
    """A CSV file (or a folder of them) is a mistake to name before the job, not a rejected row per
    file; beside data files an unsupported file is a rejected row (above)."""
    (tmp_path / "records.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"holds no data files .*found records\.csv\)"):
        plan_shards(ReadConfig(str(tmp_path / "records.csv")))
    for i in range(4):
        (tmp_path / f"part-{i}.txt").write_text("x\n")
    with pytest.raises(ValueError, match=r"found part-0\.txt, part-1\.txt, part-2\.txt, \.\.\.\)"):
        plan_shards(ReadConfig(str(tmp_path)))


def test_files_under_hidden_names_are_not_read_and_the_data_looking_ones_are_named(tmp_path):
    for name in ("a.jsonl", "_SUCCESS", ".a.jsonl.crc", "_2024_export.jsonl", ".hidden.jsonl", "_archive/old.parquet"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text('{"product_id": "1"}\n')
    plan = reader.plan_input(ReadConfig(str(tmp_path)))
    assert [s.uri.rsplit("/", 1)[-1] for s in plan.shards] == ["a.jsonl"]
    assert [u.rsplit("/", 2)[-2:] for u in plan.ignored] == [
        [tmp_path.name, ".hidden.jsonl"], [tmp_path.name, "_2024_export.jsonl"], ["_archive", "old.parquet"]]
    only_hidden = tmp_path / "only"
    only_hidden.mkdir()
    (only_hidden / "_SUCCESS").write_text("")
    (only_hidden / "_part.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match=r"no data files .*; files under names that begin with _ or \. are not read, "
                       r"e\.g\. .*_part\.jsonl$"):
        plan_shards(ReadConfig(str(only_hidden)))


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        plan_shards(ReadConfig(str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no data files"):
        plan_shards(ReadConfig(str(tmp_path / "empty")))


def test_s3_listing_reading_and_atomic_writes(s3_server):
    bucket = s3_server.make_bucket("io")
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="in/a.jsonl", Body=b'{"product_id": "1"}\n{"product_id": "2"}\n')
    client.put_object(Bucket=bucket, Key="in/sub/b.jsonl", Body=b'{"product_id": "3"}\n')
    client.put_object(Bucket=bucket, Key="in/_SUCCESS", Body=b"")
    client.put_object(Bucket=bucket, Key="in/_old/c.jsonl", Body=b'{"product_id": "4"}\n')
    files, _ = reader.list_input(f"s3://{bucket}/in")
    assert [(f.uri, f.size) for f in files] == [(f"s3://{bucket}/in/a.jsonl", 40), (f"s3://{bucket}/in/sub/b.jsonl", 20)]
    assert all(f.modified > 0 for f in files)  # S3's LastModified
    plan = reader.plan_input(ReadConfig(f"s3://{bucket}/in"))
    assert plan.ignored == [f"s3://{bucket}/in/_old/c.jsonl"]  # not _SUCCESS
    assert reader.plan_input(ReadConfig(f"s3://{bucket}/in")).modified == plan.modified  # the same listing, the same digest
    client.put_object(Bucket=bucket, Key="in/a.jsonl", Body=b'{"product_id": "1"}\n{"product_id": "2"}\n')  # again
    assert [s.shard_id for s in reader.plan_input(ReadConfig(f"s3://{bucket}/in")).shards] == [s.shard_id for s in plan.shards]
    assert [r.value["product_id"] for r in rows_of(ReadConfig(f"s3://{bucket}/in/", shard_bytes=25))] == ["1", "2", "3"]

    target = f"s3://{bucket}/out/x/data.json"
    io.write_json(target, {"k": [1, 2]})
    assert io.read_json(target) == {"k": [1, 2]} and io.exists(target)
    assert io.list_files(f"s3://{bucket}/out") == [target]
    io.delete_if_exists(target)
    io.delete_if_exists(target)  # deleting twice is fine
    assert not io.exists(target)


def test_a_file_created_only_if_none_is_there_local_and_s3(tmp_path, s3_server):
    """``_job.json`` is claimed this way: of callers at the same moment exactly one creates the file."""
    from concurrent.futures import ThreadPoolExecutor

    from pipelines import commit

    bucket = s3_server.make_bucket("create-new")
    for root in (str(tmp_path / "local"), f"s3://{bucket}/out"):
        target = io.join(root, "deep", "_job.json")
        assert io.create_new(target, b"first") and not io.create_new(target, b"second")
        assert io.read_bytes(target) == b"first" and io.list_files(root) == [target]  # no temporary file left
        racing = io.join(root, "race", "_job.json")
        with ThreadPoolExecutor(8) as pool:
            won = list(pool.map(lambda i: io.create_new(racing, str(i).encode()), range(8)))
        assert won.count(True) == 1 and io.read_bytes(racing) == str(won.index(True)).encode()
        # what a job's output holds; --overwrite's delete keeps its own attempt's record alone
        for name in ("_job.json", "_commits/s/000000.json", "_attempts/a.json", "_attempts/b.json", "attributes/c/x.parquet"):
            io.write_bytes(io.join(root, "job", name), b"{}")
        commit.discard(io.join(root, "job"), keep=io.join(root, "job", "_attempts", "b.json"))
        assert io.list_files(io.join(root, "job")) == [io.join(root, "job", "_attempts", "b.json")]
        commit.discard(io.join(root, "job"))
        assert io.list_files(io.join(root, "job")) == []


@pytest.mark.parametrize("store", ["refuses", "ignores"])
def test_a_store_without_conditional_writes_still_creates_a_file_once(s3_server, monkeypatch, store):
    """A store that answers a conditional PutObject with 501 gets a check and a plain PutObject; one
    that takes ``If-None-Match`` and ignores it (200 to a second write) is caught by the check made
    first, so a resume is not taken for a new claim (helper-32)."""
    import botocore.exceptions

    client = io._s3_client(*io._s3_settings())

    class WithoutConditions:
        def put_object(self, **kwargs):
            if "IfNoneMatch" in kwargs and store == "refuses":
                raise botocore.exceptions.ClientError(
                    {"Error": {"Code": "NotImplemented"}, "ResponseMetadata": {"HTTPStatusCode": 501}}, "PutObject")
            kwargs.pop("IfNoneMatch", None)
            return client.put_object(**kwargs)

    monkeypatch.setattr(io, "_s3_client", lambda *settings: WithoutConditions())
    target = f"s3://{s3_server.make_bucket(store)}/out/_job.json"
    assert io.create_new(target, b"first") and not io.create_new(target, b"second")
    assert io.read_bytes(target) == b"first"


def test_s3_requests_are_tried_again_through_a_short_outage(tmp_path, monkeypatch):
    """A dropped or refused S3 request is tried again (standard retry mode, ``io.s3_attempts()``)
    instead of failing the job's task: the store is stopped and started again on the same ports
    while a write (boto3) and a listing (pyarrow) are under way."""
    import threading

    import boto3

    from tests.conftest import S3_ACCESS_KEY, S3_REGION, S3_SECRET_KEY, _start_weed, weed_ports

    ports = weed_ports(5)
    endpoint = f"http://127.0.0.1:{ports[0]}"
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY":
                        S3_SECRET_KEY, "AWS_DEFAULT_REGION": S3_REGION, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    assert io.s3_attempts() == io.S3_ATTEMPTS == 10
    client = boto3.client("s3", endpoint_url=endpoint, region_name=S3_REGION)

    def start() -> object:
        process, _ = _start_weed(str(tmp_path), ports)
        deadline = time.time() + 90
        while True:
            try:
                client.list_buckets()
                return process
            except Exception:
                assert process.poll() is None and time.time() < deadline, "weed mini did not start"
                time.sleep(0.3)

    process = start()
    try:
        client.create_bucket(Bucket="outage")
        io.write_json("s3://outage/before.json", {"n": 1})
        process.terminate()
        process.wait(timeout=30)
        restart = threading.Timer(2.0, lambda: processes.append(start()))
        processes: list = []
        restart.start()
        assert io.exists("s3://outage/before.json")  # pyarrow: refused until the store is back
        restart.join()
        process = processes[0]
        process.terminate()
        process.wait(timeout=30)
        restart = threading.Timer(2.0, lambda: processes.append(start()))
        restart.start()
        io.write_json("s3://outage/during.json", {"n": 2})  # boto3: the same
        restart.join()
        assert io.list_files("s3://outage") == ["s3://outage/before.json", "s3://outage/during.json"]
        process = processes[-1]
    finally:
        process.terminate()
        process.wait(timeout=30)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "0")
    with pytest.raises(ValueError, match="AWS_MAX_ATTEMPTS must be at least 1, got 0"):
        io.filesystem("s3://outage/x")


def test_an_interrupted_delete_never_leaves_a_job_that_looks_finished_or_unclaimed(tmp_path, monkeypatch):
    """--overwrite (or a failed run) deletes the report and the manifests first and the claim last:
    stopped after any number of deletions, the output either still holds `_job.json` (a later
    --overwrite can finish the delete) with no report and no manifest of a chunk whose files are
    gone, or holds nothing. A file gone since the listing is passed over (helper-32)."""
    from pipelines import commit

    names = ["_job.json", "_report.json", "_report.md", "_commits/s/000000.json", "_commits/s/_chunks-1.json",
             "_attempts/a.json", "_attempts/mine.json", "_dedup/_index.json", "attributes/category=T/s-000000.parquet",
             "rejected/s-000000.parquet"]
    real = io.filesystem

    class Stops(Exception):
        pass

    for allowed in range(12):
        output = tmp_path / f"out{allowed}"
        for name in names:
            io.write_bytes(str(output / name), b"{}")
        deletions = []

        class Counting:
            def __init__(self, fs):
                self.fs = fs

            def __getattr__(self, name):
                return getattr(self.fs, name)

            def _count(self, path):
                if len(deletions) == allowed:
                    raise Stops()
                deletions.append(path)
                if path.endswith("/rejected"):
                    self.fs.delete_dir(path)  # gone meanwhile: the real call then finds nothing
                    raise FileNotFoundError(path)

            def delete_dir(self, path):
                self._count(path)
                self.fs.delete_dir(path)

            def delete_file(self, path):
                self._count(path)
                self.fs.delete_file(path)

        monkeypatch.setattr(io, "filesystem", lambda uri: (Counting(real(uri)[0]), real(uri)[1]))
        try:
            commit.discard(str(output), keep=str(output / "_attempts" / "mine.json"))
            finished = True
        except Stops:
            finished = False
        monkeypatch.setattr(io, "filesystem", real)
        left = {f[len(str(output)) + 1:] for f in io.list_files(str(output))}
        if finished:
            assert left == {"_attempts/mine.json"}, allowed
            continue
        assert "_job.json" in left, (allowed, left)  # still an hpd extract output
        if not {"attributes/category=T/s-000000.parquet", "rejected/s-000000.parquet"} <= left:
            assert not any(n.startswith(("_report", "_commits")) for n in left), (allowed, left)


def test_local_writes_leave_no_temporary_files(tmp_path):
    target = str(tmp_path / "deep" / "dir" / "t.parquet")
    io.write_parquet(target, pa.table({"a": [1]}))
    io.write_parquet(target, pa.table({"a": [2]}))  # replaces
    assert pq.read_table(target).column("a").to_pylist() == [2]
    assert io.list_files(str(tmp_path)) == [target]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_file_written_through_a_local_path_appears_whole_or_not_at_all(tmp_path, where, request):
    root = str(tmp_path) if where == "local" else f"s3://{request.getfixturevalue('s3_server').make_bucket('io')}"
    target = io.join(root, "a", "big.parquet")
    with pytest.raises(RuntimeError, match="stopped"):
        with io.writing(target) as local:
            pq.write_table(pa.table({"a": [1]}), local)
            raise RuntimeError("stopped")
    assert not io.exists(target) and not io.list_files(root) and not os.path.exists(local)  # nothing, not even its temporary file
    with io.writing(target) as local:
        with pq.ParquetWriter(local, pa.schema([("a", pa.int64())])) as writer:
            writer.write_table(pa.table({"a": [1, 2]}))
        assert not io.exists(target)  # not before the block ends
    assert io.list_files(root) == [target] and not os.path.exists(local)
    fs, path = io.filesystem(target)
    assert pq.ParquetFile(fs.open_input_file(path)).read().column("a").to_pylist() == [1, 2]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_files_are_deleted_in_batches_and_one_already_gone_is_passed_over(tmp_path, where, request, monkeypatch):
    root = str(tmp_path) if where == "local" else f"s3://{request.getfixturevalue('s3_server').make_bucket('io')}"
    files = [io.join(root, "d", f"{i}.json") for i in range(5)]
    for uri in files[:4]:
        io.write_json(uri, {})
    keep = io.join(root, "d", "kept.json")
    io.write_json(keep, {})
    monkeypatch.setattr(io, "DELETE_BATCH", 2)
    io.delete_files(files)  # files[4] was never there
    io.delete_files([])
    assert io.list_files(root) == [keep]


def test_ipc_round_trip():
    table = pa.table({"a": [1, None], "b": [["x"], []]})
    assert io.table_from_bytes(io.table_to_bytes(table)).equals(table)


def test_weed_ports_never_give_one_service_anothers_grpc_port():
    """weed mini puts each service's gRPC at its port + 10000 and exits when a service port is one of
    those ("Port allocation failed: ... reserved for gRPC calculation", seen once in the suite):
    the test server's ports and their gRPC ports are all distinct."""
    from tests.conftest import GRPC_PORT_OFFSET, weed_ports

    for _ in range(20):
        ports = weed_ports(5)
        everything = ports + [p + GRPC_PORT_OFFSET for p in ports]
        assert len(set(everything)) == len(everything) and max(everything) < 65536


def test_a_shards_identity_is_its_files_path_size_and_byte_range_only():
    """Committed chunks and the id index are found again by shard id: the formula of outputs
    written since 2026-11-21 (a change would make every earlier output unresumable). The file's
    modification time is not in it (see reader.modification_digest)."""
    from pipelines.reader import InputFile, _shard_id

    assert _shard_id(InputFile("/data/in/a.jsonl", 1234, 5), 0, 1234) == "af9ac9439ac55164"
    assert _shard_id(InputFile("/data/in/a.jsonl", 1234, 6), 0, 1234) == "af9ac9439ac55164"


@pytest.mark.parametrize("with_errno", [True, False], ids=["errno", "message-only"])
def test_a_read_cut_short_by_an_io_error_never_marks_its_shard_read(tmp_path, monkeypatch, with_errno):
    """An I/O error (EIO on a network mount) is the store's, not the file's: it is raised. One that
    does not say so (no errno) reads as a corrupt file's rest, one rejected row; then the prepare
    stage finds fewer rows than the id index counted and fails the shard instead of marking it read
    (helper-27, session 51: the rows after the error were in neither attributes/ nor rejected/)."""
    import errno

    from pipelines import idindex, prepare
    from pipelines.schema import ValidationConfig, load_schema
    from pipelines.stacking import StackingConfig
    from tests.pipelines.helpers import SAMPLE_ATTRIBUTES, sample_records

    pq.write_table(pa.Table.from_pylist(sample_records()), tmp_path / "in.parquet", row_group_size=10)
    read = ReadConfig(str(tmp_path / "in.parquet"), chunk_rows=10, group_chunks=1, read_block_bytes=200)
    (shard,) = plan_shards(read)
    config = prepare.PrepareConfig(read, ValidationConfig(), StackingConfig(), load_schema(str(SAMPLE_ATTRIBUTES)),
                                   str(tmp_path / "out"))
    batches = pq.ParquetFile.iter_batches

    def flaky(self, *args, **kwargs):
        done = 0
        for batch in batches(self, *args, **kwargs):
            done += batch.num_rows
            if done > 20:
                raise OSError(errno.EIO, "Input/output error") if with_errno else OSError("Input/output error")
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", flaky)
    rows = [dict(vars(shard), skip=[], index=idindex.to_json(idindex.ShardIndex(rows=40, verdicts=())))]
    with pytest.raises(OSError if with_errno else RuntimeError,
                       match="Input/output error" if with_errno else "read 21 rows of .* the id index counted 40"):
        list(prepare.prepare_shards(pa.Table.from_pylist(rows), config))
    assert not io.list_files(str(tmp_path / "out"))  # no _chunks marker: a resume reads the shard again


def test_exist_asks_for_several_files_at_once_locally_and_on_s3(tmp_path, s3_server):
    """The writers' lease check asks for three files a chunk through one file system (a new S3 one
    per request opens connections anew: about 50 ms each on the local SeaweedFS, helper-52)."""
    from pipelines import io

    bucket = s3_server.make_bucket("exist")
    for root in (str(tmp_path / "o"), f"s3://{bucket}/o"):
        io.write_json(io.join(root, "a.json"), {})
        assert io.exist([io.join(root, "a.json"), io.join(root, "b.json"), io.join(root, "a.json")]) == [True, False, True]
        assert io.exist([]) == []
        assert [io.exists(io.join(root, n)) for n in ("a.json", "b.json")] == [True, False]


def test_temporary_files_of_killed_writers_are_swept_on_the_next_s3_write(tmp_path, s3_server, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own TMPDIR, not yet swept
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = {
            "killed": tmp_path / f"{io._temporary_prefix(gone.pid)}abc-big.parquet",  # its process is gone
            "running": tmp_path / f"{io._temporary_prefix(alive.pid)}def-big.parquet",  # still at work
            "other host": tmp_path / f".hpd-elsewhere-{io._pid_space()}-{gone.pid}-ghi-big.parquet",  # a shared folder's
            "other container": tmp_path / f"{io._temporary_prefix(gone.pid).replace(f'-{io._pid_space()}-', '-1-')}mno-big.parquet",
            "not ours": tmp_path / f".hpd-{gone.pid}-jkl.parquet",
        }
        for path in left.values():
            path.write_bytes(b"x" * 100)
        target = f"s3://{s3_server.make_bucket('sweep')}/a/new.parquet"
        with io.writing(target) as local:
            assert os.path.basename(local).startswith(io._temporary_prefix(os.getpid()))
            pq.write_table(pa.table({"a": [1]}), local)
        assert io.list_files(target.rsplit("/", 2)[0]) == [target]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(left[k].name for k in ("running", "other host", "other container", "not ours"))
        assert io.sweep_temporaries() == []  # once per process and folder
    finally:
        alive.kill()
        alive.wait()
