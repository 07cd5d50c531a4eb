"""records.jsonl as bench and evaluate read it (datafiles/dataset.py)."""

import gzip
from pathlib import Path

import pytest

from datafiles.dataset import read_records


def test_read_records_takes_integer_ids_gzip_and_a_limit(tmp_path: Path):
    source = tmp_path / "records.jsonl.gz"
    source.write_bytes(gzip.compress(b'{"product_id": 7, "category": "Tea", "title": "green tea"}\n\n'
                                     b'{"product_id": "b", "category": "Tea", "title": "black tea"}\n'))
    assert read_records(source) == [{"product_id": "7", "category": "Tea", "title": "green tea"},
                                    {"product_id": "b", "category": "Tea", "title": "black tea"}]
    assert [r["product_id"] for r in read_records(source, limit=1)] == ["7"]


@pytest.mark.parametrize(("line", "message"), [
    ("[1, 2]", "line 2: expected a JSON object, got list"),
    ('{"product_id": "x", "category": "Tea"}', r"line 2: 'title' must be a non-empty string \(missing\)"),
    ('{"product_id": 1.5, "category": "Tea", "title": "t"}', r"line 2: 'product_id' must be a non-empty string \(got float 1.5\)"),
    ('{"product_id": "x", "category": "Tea", "title": "t", "title": "u"}', r"line 2: a key given more than once: \['title'\]"),
])
def test_read_records_errors_name_the_line(tmp_path: Path, line: str, message: str):
    source = tmp_path / "records.jsonl"
    source.write_text('{"product_id": "a", "category": "Tea", "title": "t"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_records(source)
