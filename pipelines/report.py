"""Counters per chunk, their totals, and the job report (``_report.json`` + ``_report.md``).

Every chunk's commit manifest carries its counters, so totals over a resumed job are the sum over
all manifests; wall time, device time and cost are those of the run that writes the report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pipelines import io

COUNTERS = (
    "rows_in",  # input rows of the chunk (records, malformed lines, unreadable files)
    "products_out",  # products with attribute rows in attributes/
    "rejected",  # rows in rejected/
    "skipped",  # rows skipped because an earlier output has the product (--skip-existing)
    "attribute_rows",  # rows in attributes/ (products_out x attributes of their category)
    "values_null",
    "values_truncated",  # the value reached max_value_tokens
    "parse_errors",  # the model's text for a slot was not valid JSON
    "inputs_truncated",  # the product text was cut to max_text_chars
    "prompts",
    "prompt_tokens",
    "generated_tokens",
    "forward_passes",  # summed over prompts: model calls each prompt took part in
)


@dataclass(frozen=True)
class ReportConfig:
    """price_per_gpu_hour: default g6e.48xlarge on-demand, $30.13/h for 8 L40S GPUs."""

    price_per_gpu_hour: float = 3.77

    def __post_init__(self) -> None:
        if self.price_per_gpu_hour < 0:
            raise ValueError(f"price_per_gpu_hour must be >= 0, got {self.price_per_gpu_hour}")


@dataclass
class Stats:
    """A running sum of chunk counters (mutable: the driver adds chunks as they commit)."""

    counts: Counter = field(default_factory=Counter)
    rejected_by_stage: Counter = field(default_factory=Counter)
    decode_seconds: float = 0.0
    chunks: int = 0
    actors: set = field(default_factory=set)

    def add(self, chunk: dict) -> None:
        for name in COUNTERS:
            self.counts[name] += int(chunk.get(name, 0))
        self.rejected_by_stage.update(chunk.get("rejected_by_stage", {}))
        self.decode_seconds += float(chunk.get("decode_seconds", 0.0))
        self.chunks += 1
        if chunk.get("actor"):
            self.actors.add(chunk["actor"])

    def merged(self, other: Stats) -> Stats:
        return Stats(
            self.counts + other.counts,
            self.rejected_by_stage + other.rejected_by_stage,
            self.decode_seconds + other.decode_seconds,
            self.chunks + other.chunks,
            self.actors | other.actors,
        )


def build_report(
    config: ReportConfig,
    meta: dict,
    total: Stats,
    this_run: Stats,
    wall_seconds: float,
    device: str,
    devices: float,
) -> dict:
    """The report as a JSON-able dict. ``device`` is "gpu" or "cpu"; ``devices`` how many were held."""
    device_seconds = wall_seconds * devices
    products = this_run.counts["products_out"]
    cost = device_seconds / 3600 * config.price_per_gpu_hour
    run = {
        "chunks": this_run.chunks,
        "rows_in": this_run.counts["rows_in"],
        "products_out": products,
        "wall_seconds": round(wall_seconds, 3),
        "device": device,
        "devices": devices,
        "device_seconds": round(device_seconds, 3),
        f"{device}_seconds": round(device_seconds, 3),
        "busy_device_seconds": round(this_run.decode_seconds, 3),
        "products_per_second_per_device": round(products / device_seconds, 3) if device_seconds else None,
        "price_per_gpu_hour": config.price_per_gpu_hour,
        "usd_per_1k_products": round(cost / products * 1000, 6) if products else None,
        "extract_actor_processes": len(this_run.actors),
    }
    report = dict(meta)
    report.update({name: total.counts[name] for name in COUNTERS})
    report["rows_rejected"] = total.counts["rejected"]
    report["rows_skipped"] = total.counts["skipped"]
    report["rejected_by_stage"] = dict(sorted(total.rejected_by_stage.items()))
    report["chunks"] = total.chunks
    report["resumed"] = total.chunks > this_run.chunks
    report.update({k: v for k, v in run.items() if k not in COUNTERS and k != "chunks"})  # time, cost: this run
    report["this_run"] = run
    return report


def render_markdown(report: dict) -> str:
    device = report["device"].upper()
    lines = [
        f"# Extraction report `{report['run_id']}`",
        "",
        f"- input: `{report['input']}`  output: `{report['output']}`",
        f"- decoder: `{report['decoder']}`  model: `{report['model']}`"
        + (f" + adapter `{report['adapter']}`  " if report.get("adapter") else "  ")
        + f"J = {report['docs_per_prompt']}  K_max = {report['max_value_tokens']}",
        "",
        "| rows in | products out | rejected | skipped | attribute rows |",
        "|---:|---:|---:|---:|---:|",
        f"| {report['rows_in']} | {report['products_out']} | {report['rows_rejected']} "
        f"| {report['rows_skipped']} | {report['attribute_rows']} |",
        "",
        "Rejected by stage: "
        + (", ".join(f"{stage} {n}" for stage, n in report["rejected_by_stage"].items()) or "none"),
        "",
        "| prompts | prompt tokens | generated tokens | forward passes | truncated values | parse errors |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {report['prompts']} | {report['prompt_tokens']} | {report['generated_tokens']} "
        f"| {report['forward_passes']} | {report['values_truncated']} | {report['parse_errors']} |",
        "",
        f"This run{' (resumed: earlier runs committed part of the job)' if report['resumed'] else ''}: "
        f"{report['this_run']['products_out']} products in {report['wall_seconds']} s on "
        f"{report['devices']} {device} ({report['device_seconds']} {device}-seconds, "
        f"{report['busy_device_seconds']} s busy decoding), "
        f"{report['products_per_second_per_device']} products/s per {device}, "
        f"${report['usd_per_1k_products']} per 1k products at ${report['price_per_gpu_hour']} per device-hour.",
        "",
    ]
    return "\n".join(lines)


def write_report(output_uri: str, report: dict) -> None:
    io.write_json(io.join(output_uri, "_report.json"), report)
    io.write_bytes(io.join(output_uri, "_report.md"), render_markdown(report).encode())
