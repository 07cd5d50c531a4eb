"""The rows a finished job rejected, read back from its ``rejected/`` files (pipelines/commit.py
describes the layout): counted by stage and reason, and their original records, which a corrected
job (other settings, a larger device, a fixed input) can take again as its input."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines import io
from pipelines.commit import REJECTED_SCHEMA

STAGES = ("read", "validate", "dedup", "extract")  # where a row can be rejected, in pipeline order


@dataclass(frozen=True)
class Rejected:
    """The rejected rows of one output (``stages``: those kept, None for all), in file and row order."""

    table: pa.Table  # REJECTED_SCHEMA
    rows_rejected: int  # what the output's report says it rejected, all stages

    def by_stage(self) -> dict[str, int]:
        counts = Counter(self.table.column("stage").to_pylist())
        return {stage: counts[stage] for stage in (*STAGES, *sorted(set(counts) - set(STAGES))) if counts[stage]}

    def reasons(self, top: int = 10) -> list[tuple[str, str, int]]:
        """The ``top`` most frequent (stage, reason, rows)."""
        pairs = Counter(zip(self.table.column("stage").to_pylist(), self.table.column("reason").to_pylist()))
        return [(stage, reason, n) for (stage, reason), n in pairs.most_common(top)]

    def records_jsonl(self) -> bytes:
        """The original records, one a line: an input for ``hpd extract --input``. A record that could
        not be read is written as it was read (a JSON line that did not parse stays as it was)."""
        return "".join(record + "\n" for record in self.table.column("record").to_pylist()).encode()


def read_rejected(output_uri: str, stages: tuple[str, ...] | None = None) -> Rejected:
    """The rejected rows of the finished job at ``output_uri``; only a finished job (its
    ``_report.json`` written) is read: before that, files of chunks not yet committed may be there."""
    unknown = sorted(set(stages or ()) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}: choose from {', '.join(STAGES)}")
    report_uri = io.join(output_uri, "_report.json")
    if not io.exists(report_uri):
        what = "is not an hpd extract output" if not io.exists(io.join(output_uri, "_job.json")) else \
            "has not finished (no _report.json yet; the same hpd extract command resumes it)"
        raise ValueError(f"{output_uri} {what}")
    report = io.read_json(report_uri)
    tables = [pq.read_table(path, filesystem=fs, schema=REJECTED_SCHEMA)
              for fs, path in map(io.filesystem, sorted(io.list_files(io.join(output_uri, "rejected"))))]
    table = pa.concat_tables(tables) if tables else REJECTED_SCHEMA.empty_table()
    if table.num_rows != report["rows_rejected"]:
        raise ValueError(f"{output_uri}: rejected/ holds {table.num_rows} rows, its report says {report['rows_rejected']}")
    if stages:
        table = table.filter(pc.is_in(table.column("stage"), value_set=pa.array(list(stages), pa.string())))
    return Rejected(table, report["rows_rejected"])


def summary(rejected: Rejected) -> str:
    """The counts, for a person: rows by stage, then the most frequent reasons."""
    lines = [f"{rejected.table.num_rows} rejected row(s)" + (f" of {rejected.rows_rejected}" if
             rejected.table.num_rows != rejected.rows_rejected else "") + ": " +
             (", ".join(f"{stage} {n}" for stage, n in rejected.by_stage().items()) or "none")]
    lines += [f"  {n:>8}  {stage:<8}  {reason}" for stage, reason, n in rejected.reasons()]
    return "\n".join(lines)


def as_json(rejected: Rejected) -> dict:
    return {"rejected": rejected.table.num_rows, "by_stage": rejected.by_stage(),
            "reasons": [{"stage": s, "reason": r, "rows": n} for s, r, n in rejected.reasons()]}


