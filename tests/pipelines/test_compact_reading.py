"""Readers of an output and `hpd compact` at once: a reader that began before a compaction, or read
across one, says so (run it again) instead of failing on a file gone or counting a group's rows twice
(helper-53, session 57)."""

from __future__ import annotations

import io as text_io

import pyarrow as pa
import pytest

import datafiles.predictions as predictions
from pipelines import compact, io
from pipelines.commit import ATTRIBUTES_SCHEMA, attributes_uri, chunk_key

ACROSS = "worked on .* while this command read it"


def finished_output(tmp_path, files: int = 4) -> str:
    """A finished output (as far as compaction and readers look) of ``files`` small files of one category."""
    output = str(tmp_path / "out")
    for i in range(files):
        rows = {"product_id": [f"p{i}a", f"p{i}b"], "attribute": ["Brand", "Brand"], "value": ["acme", None],
                "truncated": [False, False], "run_id": ["r", "r"]}
        io.write_parquet(attributes_uri(output, "Tea", chunk_key("s", i)),
                         pa.table({f.name: rows.get(f.name, [None, None]) for f in ATTRIBUTES_SCHEMA}, schema=ATTRIBUTES_SCHEMA))
    io.write_json(io.join(output, "_job.json"), {"run_id": "r"})
    io.write_json(io.join(output, "_report.json"), {"rows_rejected": 0})
    return output


def run_compaction(output: str) -> None:
    compact.compact(compact.CompactConfig(uri=output, workers=1), stream=text_io.StringIO())


def test_a_reader_that_began_before_a_compaction_says_so(tmp_path, monkeypatch):
    output = finished_output(tmp_path)
    assert predictions.read_predictions(output, only={"p0a"}).products == 8
    opened = predictions._open

    def compacted_first(filesystem, path):  # the compaction runs after the reader listed the files
        if not io.exists(io.join(output, compact.DONE)):
            run_compaction(output)
        return opened(filesystem, path)

    monkeypatch.setattr(predictions, "_open", compacted_first)
    with pytest.raises(ValueError, match=ACROSS):
        predictions.read_predictions(output, only={"p0a"})
    monkeypatch.undo()
    assert predictions.read_predictions(output, only={"p0a"}).products == 8  # once it ended, the same answer


def test_a_compaction_that_ran_through_a_read_is_said_even_without_an_error(tmp_path):
    output = finished_output(tmp_path)
    with pytest.raises(ValueError, match=ACROSS):
        with compact.reading(output):
            run_compaction(output)  # read before or after: nothing failed, and the read may count rows twice
    with compact.reading(output):  # nothing ran meanwhile
        pass
    io.write_json(io.join(output, compact.MARKER), {"attempt": "x"})
    with pytest.raises(ValueError, match="is being compacted"):
        with compact.reading(output):
            pass
