"""`datafiles.storage`: URIs to file systems, text and JSON Lines reading."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from datafiles.storage import read_json_lines, read_jsonl, read_text, s3_options


def test_s3_options_from_environment():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "eu-west-1"}
    assert s3_options(env) == {"scheme": "http", "endpoint_override": "127.0.0.1:9000", "access_key": "k", "secret_key": "s", "region": "eu-west-1"}
    assert s3_options({"AWS_DEFAULT_REGION": "us-east-1"}) == {"region": "us-east-1"}


def test_read_jsonl_numbers_lines_and_skips_blanks(tmp_path: Path):
    rows = [{"a": 1}, {"b": "line\u2028separator\x85inside"}]  # ensure_ascii=False keeps these raw
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(rows[0]) + "\n  \n" + json.dumps(rows[1], ensure_ascii=False) + "\r\n", encoding="utf-8")
    assert list(read_jsonl(source)) == [(1, rows[0]), (3, rows[1])]
    assert list(read_jsonl(str(source))) == list(read_jsonl(f"file://{source}"))
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(source.read_bytes()))
    assert list(read_jsonl(packed)) == [(1, rows[0]), (3, rows[1])]


@pytest.mark.parametrize(
    ("line", "message"),
    [("{not json", "line 2: not valid JSON .* at column 2"), ("[1, 2]", "line 2: expected a JSON object, got list"),
     ('{"a": {"b": 1, "b": 2}}', r"line 2: a key given more than once: \['b'\] \(JSON would keep only the last\)")],
)
def test_read_jsonl_errors_name_file_and_line(tmp_path: Path, line: str, message: str):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"ok": true}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{source} {message}"):
        list(read_jsonl(source))


def test_read_json_lines_keeps_non_objects(tmp_path: Path):
    source = tmp_path / "any.jsonl"
    source.write_text('[1, 2]\n"x"\n{"a": 1}\n', encoding="utf-8")
    assert list(read_json_lines(source)) == [(1, [1, 2]), (2, "x"), (3, {"a": 1})]


def test_read_text_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="file not found: .*missing.txt"):
        read_text(tmp_path / "missing.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt: not UTF-8 text"):
        read_text(tmp_path / "latin1.txt")
    with pytest.raises(ValueError, match="unsupported URI scheme 'gs'"):
        read_text("gs://bucket/x")


def test_a_byte_order_mark_is_dropped_as_hpd_extract_drops_it(tmp_path: Path):
    """Excel and Windows tools write UTF-8 with a byte-order mark: `hpd extract` read such records,
    `hpd finetune`, `evaluate` and `convert` refused them (helper-26, session 51)."""
    from pipelines.schema import load_schema

    source = tmp_path / "gold.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + b'{"product_id": "a", "category": "Tea"}\n')
    assert list(read_jsonl(source)) == [(1, {"product_id": "a", "category": "Tea"})]
    (tmp_path / "attributes.json").write_bytes(b"\xef\xbb\xbf" + b'{"Tea": ["Flavor"]}')
    assert [a.name for a in load_schema(str(tmp_path / "attributes.json")).attributes("Tea")] == ["Flavor"]
