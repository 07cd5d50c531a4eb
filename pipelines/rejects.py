"""The rows a finished job rejected, read back from its ``rejected/`` files (pipelines/commit.py
describes the layout): counted by stage and reason, and their original records, which a corrected
job (other settings, a larger device, a fixed input) can take again as its input. One file (a
chunk's rejected rows) is in memory at a time, so an output of any size can be read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines import io
from pipelines.commit import REJECTED_SCHEMA
from pipelines.compact import reading

STAGES = ("read", "validate", "dedup", "extract")  # where a row can be rejected, in pipeline order


@dataclass
class Rejected:
    """What was read: the rows kept (of ``stages``), by (stage, reason), those left out by stage,
    and all the output's rows."""

    reasons: Counter = field(default_factory=Counter)  # (stage, reason) -> rows kept
    rows_rejected: int = 0  # every row of rejected/, all stages (the report's rows_rejected)
    left_out: Counter = field(default_factory=Counter)  # stage -> rows not of ``stages``

    @property
    def rows(self) -> int:
        return sum(self.reasons.values())

    def by_stage(self) -> dict[str, int]:
        counts = Counter()
        for (stage, _), n in self.reasons.items():
            counts[stage] += n
        return _in_order(counts)

    def top_reasons(self, top: int = 10) -> list[tuple[str, str, int]]:
        """The ``top`` most frequent (stage, reason, rows)."""
        return [(stage, reason, n) for (stage, reason), n in self.reasons.most_common(top)]


def read_rejected(output_uri: str, stages: tuple[str, ...] | None = None, records: BinaryIO | None = None) -> Rejected:
    """Count the rejected rows of the finished job at ``output_uri`` (only those of ``stages``, all
    by default) and write their original records to ``records``, one a line, chunk by chunk (in
    input order within a chunk; a record that could not be read is written as it was read: a line
    that is not JSON stays as it was). Only a finished job (``_report.json`` written) is read: before that, files of chunks not yet
    committed may be there. rejected/ must hold exactly the rows the report counts."""
    unknown = sorted(set(stages or ()) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}: choose from {', '.join(STAGES)}")
    report_uri = io.join(output_uri, "_report.json")
    if not io.exists(report_uri):
        what = ("is not an hpd extract output" if not io.exists(io.join(output_uri, "_job.json"))
                else "has not finished (no _report.json yet; the same hpd extract command resumes it)")
        raise ValueError(f"{output_uri} {what}")
    with reading(output_uri):  # not while `hpd compact` moves its files
        return _read_rejected(output_uri, io.read_json(report_uri)["rows_rejected"], stages, records)


def _read_rejected(output_uri: str, expected: int, stages: tuple[str, ...] | None, records: BinaryIO | None) -> Rejected:
    """``read_rejected`` once checked: ``expected``, the rows the report counts."""
    kept = pa.array(list(stages or STAGES), pa.string())
    result = Rejected()
    fs, found = io.list_paths(io.join(output_uri, "rejected"))
    # chunk keys in order (rows in input order within a chunk); not the hidden temporary file a
    # write interrupted on local disk may leave (io.write_bytes), which holds no committed row
    for path in [info.path for info in found if not info.base_name.startswith(".")]:
        table = pq.read_table(path, filesystem=fs, schema=REJECTED_SCHEMA, columns=["record", "reason", "stage"])
        result.rows_rejected += table.num_rows
        chosen = pc.is_in(table.column("stage"), value_set=kept)
        result.left_out.update(table.filter(pc.invert(chosen)).column("stage").to_pylist())
        table = table.filter(chosen)
        result.reasons.update(zip(table.column("stage").to_pylist(), table.column("reason").to_pylist()))
        if records is not None:
            records.write("".join(record + "\n" for record in table.column("record").to_pylist()).encode())
    if result.rows_rejected != expected:
        raise ValueError(f"{output_uri}: rejected/ holds {result.rows_rejected} rows, its report says {expected}")
    return result


def summary(rejected: Rejected) -> str:
    """The counts, for a person: rows by stage, then the most frequent reasons."""
    left = ", ".join(f"{stage} {n}" for stage, n in _in_order(rejected.left_out).items())
    of = f" of {rejected.rows_rejected} (left out: {left})" if left else ""
    stages = ", ".join(f"{stage} {n}" for stage, n in rejected.by_stage().items()) or "none"
    lines = [f"{rejected.rows} rejected row(s){of}: {stages}"]
    lines += [f"  {n:>8}  {stage:<8}  {reason}" for stage, reason, n in rejected.top_reasons()]
    return "\n".join(lines)


def as_json(rejected: Rejected) -> dict:
    return {"rejected": rejected.rows, "by_stage": rejected.by_stage(),
            "reasons": [{"stage": s, "reason": r, "rows": n} for s, r, n in rejected.top_reasons()],
            "left_out": _in_order(rejected.left_out)}


def _in_order(counts: Counter) -> dict[str, int]:
    """Counts by stage in pipeline order (then any other stage by name), zeros left out."""
    return {stage: counts[stage] for stage in (*STAGES, *sorted(set(counts) - set(STAGES))) if counts[stage]}
