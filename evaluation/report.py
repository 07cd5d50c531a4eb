"""The evaluation report beside the predictions: ``_evaluation.json`` (summary plus both
per-(category, attribute) tables) and ``_evaluation.md`` (headline scores, per-category micro
scores, per-(category, attribute) table)."""

from __future__ import annotations

import json

from datafiles.storage import resolve
from evaluation.metrics import Counts, score_counts
from evaluation.scoring import EvaluationResult

REPORT_JSON = "_evaluation.json"
REPORT_MD = "_evaluation.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def render_markdown(result: EvaluationResult, title: str) -> str:
    """Headline scores, per-category micro scores and the per-(category, attribute) table."""
    lines = [f"# Evaluation: {_cell(title)}", ""]
    lines += [", ".join(f"{k}: {v}" for k, v in result.products.items()), ""]
    lines += ["| metric | P | R | F1 | NN | NV | VN | VC | VW |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, report in (("ExtractGPT", result.lenient), ("strict", result.strict)):
        c = report.counts
        for kind, s in (("micro", report.micro), ("macro", report.macro)):
            lines.append(
                f"| {name} {kind} | {_fmt(s.precision)} | {_fmt(s.recall)} | {_fmt(s.f1)} | {c.nn} | {c.nv} | {c.vn} | {c.vc} | {c.vw} |"
            )
    if result.by_confidence:
        lines += ["", "## By confidence", "",
                  "Values whose confidence is below the threshold read as null (`hpd extract --confidence`).", "",
                  "| confidence at least | values kept | share | P | R | F1 | strict P | strict F1 |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for row in result.by_confidence:
            m, s = row.micro, row.strict
            lines.append(f"| {row.threshold:g} | {row.values} | {row.share:.2f}% | {_fmt(m.precision)} | {_fmt(m.recall)} "
                         f"| {_fmt(m.f1)} | {_fmt(s.precision)} | {_fmt(s.f1)} |")  # fmt: skip
    lines += ["", "## Per category (micro)", "", "| category | P | R | F1 | strict P | strict F1 |", "|---|---:|---:|---:|---:|---:|"]
    for category in dict.fromkeys(c.category for c in result.strict.combos):
        lenient = score_counts(sum((c.counts for c in result.lenient.combos if c.category == category), Counts()))
        strict = score_counts(sum((c.counts for c in result.strict.combos if c.category == category), Counts()))
        lines.append(
            f"| {_cell(category)} | {_fmt(lenient.precision)} | {_fmt(lenient.recall)} | {_fmt(lenient.f1)} | {_fmt(strict.precision)} | {_fmt(strict.f1)} |"
        )
    lines += [
        "",
        "## Per category and attribute",
        "",
        "Strict adds the unannotated (product, attribute) pairs as gold null: only NN and NV change.",
        "",
        "| category | attribute | NN | NV | VN | VC | VW | P | R | F1 | strict NN | strict NV | strict P | strict F1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lenient_by_key = {(c.category, c.attribute): c for c in result.lenient.combos}
    for s in result.strict.combos:
        c = lenient_by_key.get((s.category, s.attribute))
        left = (
            f"{c.counts.nn} | {c.counts.nv} | {c.counts.vn} | {c.counts.vc} | {c.counts.vw} | "
            f"{_fmt(c.scores.precision)} | {_fmt(c.scores.recall)} | {_fmt(c.scores.f1)}"
            if c
            else " |  |  |  |  |  |  | "
        )
        lines.append(
            f"| {_cell(s.category)} | {_cell(s.attribute)} | {left} | {s.counts.nn} | {s.counts.nv} | "
            f"{_fmt(s.scores.precision)} | {_fmt(s.scores.f1)} |"
        )
    return "\n".join(lines) + "\n"


def write_reports(uri: str, result: EvaluationResult, extra: dict) -> tuple[str, str]:
    """Write ``_evaluation.json`` and ``_evaluation.md`` into ``uri`` (local or S3)."""
    filesystem, base = resolve(uri)
    full = {
        **extra,
        **result.summary(),
        "tables": {"extractgpt": result.lenient.to_dict()["combos"], "strict": result.strict.to_dict()["combos"]},
    }
    outputs = {REPORT_JSON: json.dumps(full, ensure_ascii=False, indent=2) + "\n", REPORT_MD: render_markdown(result, uri)}
    for name, text in outputs.items():
        with filesystem.open_output_stream(f"{base}/{name}") as stream:
            stream.write(text.encode("utf-8"))
    return f"{uri.rstrip('/')}/{REPORT_JSON}", f"{uri.rstrip('/')}/{REPORT_MD}"
