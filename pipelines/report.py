"""Counters per chunk, their totals, and the job report (``_report.json`` + ``_report.md``).

Every chunk's commit manifest carries its counters, so totals over a resumed job are the sum over
all manifests; wall time, device time and cost are summed over the job's attempts
(pipelines/attempts.py), each priced per hour of its own device kind. ``this_run`` holds the
figures of the attempt that wrote the report.
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
    "values_null",  # null values written, those set null for values_not_in_text included
    "values_not_in_text",  # values not found in their product's text, written as null (--keep-values-not-in-text)
    "values_truncated",  # the value reached max_value_tokens
    "parse_errors",  # the model's text for a slot was not valid JSON
    # values decoded a sliding window or more positions after their product's first key, where the
    # model's sliding-window layers see none of its text (hpd_core.layout.beyond_window)
    "values_beyond_window",
    # prompts too wide for the model's sliding window, decoded as prompts over groups of their
    # attributes (hpd_core/attribute_groups.py): each group prefills its products' text again
    "prompts_in_groups",
    "inputs_truncated",  # the product text was cut to max_text_chars
    "prompts",
    "prompt_tokens",
    "generated_tokens",
    "forward_passes",  # summed over prompts: model calls each prompt took part in
    "cuda_graph_failures",  # CUDA graph captures that failed: those batches ran eagerly (same values, slower)
    "batches_fixed_steps",  # engine batches decoded with fixed-shape steps (CUDA graphs), see --step-shape
    "batches_packed_steps",  # engine batches decoded with packed steps (only open values computed)
)


GPU_PRICE_PER_HOUR = 3.77  # one L40S GPU: g6e.48xlarge on-demand, $30.13/h for 8 GPUs
CPU_PRICE_PER_HOUR = 0.0425  # one vCPU: c5.2xlarge on-demand, $0.34/h for 8 vCPUs (us-east-1)
UNITS = {"gpu": "GPU-hour", "cpu": "vCPU-hour"}


@dataclass(frozen=True)
class ReportConfig:
    """Prices per device-hour for the report's $ per 1k products.

    price_per_hour: the user's price per device-hour (--price-per-hour); None: the default of the
        device kind the job runs on, ``gpu_price_per_hour`` per GPU or ``cpu_price_per_hour`` per
        vCPU (see the README for where they come from).
    """

    price_per_hour: float | None = None
    gpu_price_per_hour: float = GPU_PRICE_PER_HOUR
    cpu_price_per_hour: float = CPU_PRICE_PER_HOUR

    def __post_init__(self) -> None:
        for name in ("price_per_hour", "gpu_price_per_hour", "cpu_price_per_hour"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    def price(self, device: str) -> float:
        if self.price_per_hour is not None:
            return self.price_per_hour
        return self.gpu_price_per_hour if device == "gpu" else self.cpu_price_per_hour


@dataclass
class Stats:
    """A running sum of chunk counters (mutable: the driver adds chunks as they commit)."""

    counts: Counter = field(default_factory=Counter)
    rejected_by_stage: Counter = field(default_factory=Counter)
    decode_seconds: float = 0.0
    chunks: int = 0
    actors: set = field(default_factory=set)
    dtypes: set = field(default_factory=set)  # what the models ran in (--dtype auto resolved per actor)
    spans: set = field(default_factory=set)  # whether they decoded spans (--spans auto resolved per actor)
    compiled: set = field(default_factory=set)  # whether their layers ran compiled (--compile-layers resolved per actor)
    # decode_seconds times the devices of the actor that decoded (its torch threads' vCPUs on a CPU,
    # its GPU): the busy share of device_seconds. Chunks committed before 2026-11-30 carry no device
    # count and count one each (a CPU actor of several threads was then under-counted)
    busy_device_seconds: float = 0.0
    # category -> Counter(products, attribute_rows, values): what each category of the output holds;
    # by_category_chunks: the chunks that carried these counts (not those committed before 2026-12-01)
    by_category: dict = field(default_factory=dict)
    by_category_chunks: int = 0

    def add(self, chunk: dict) -> None:
        for name in COUNTERS:
            self.counts[name] += int(chunk.get(name, 0))
        self.rejected_by_stage.update(chunk.get("rejected_by_stage", {}))
        self.decode_seconds += float(chunk.get("decode_seconds", 0.0))
        self.busy_device_seconds += float(chunk.get("decode_seconds", 0.0)) * float(chunk.get("decode_devices", 1))
        self.chunks += 1
        if chunk.get("actor"):
            self.actors.add(chunk["actor"])
        if chunk.get("dtype"):
            self.dtypes.add(chunk["dtype"])
        if chunk.get("spans") is not None:
            self.spans.add("on" if chunk["spans"] else "off")
        if chunk.get("compiled") is not None:
            self.compiled.add("on" if chunk["compiled"] else "off")
        if "by_category" in chunk:
            self.by_category_chunks += 1
            for category, counts in chunk["by_category"].items():
                self.by_category.setdefault(category, Counter()).update(counts)

    def merged(self, other: Stats) -> Stats:
        return Stats(
            self.counts + other.counts,
            self.rejected_by_stage + other.rejected_by_stage,
            self.decode_seconds + other.decode_seconds,
            self.chunks + other.chunks,
            self.actors | other.actors,
            self.dtypes | other.dtypes,
            self.spans | other.spans,
            self.compiled | other.compiled,
            self.busy_device_seconds + other.busy_device_seconds,
            {category: self.by_category.get(category, Counter()) + other.by_category.get(category, Counter())
             for category in self.by_category.keys() | other.by_category.keys()},
            self.by_category_chunks + other.by_category_chunks,
        )


def by_category(total: Stats, schema_categories=()) -> tuple[dict | None, list | None]:
    """Per category of the output: products, attribute rows, values written (not null) and the
    share of null values; and the categories of ``schema_categories`` that no product came out in
    (a schema category the records spell otherwise, or that this input does not hold). Both None
    when some chunk carries no such counts (committed by a version before 2026-12-01)."""
    if total.by_category_chunks != total.chunks:
        return None, None
    table = {}
    for category in sorted(total.by_category):
        counts = total.by_category[category]
        rows = counts["attribute_rows"]
        table[category] = {"products": counts["products"], "attribute_rows": rows, "values": counts["values"],
                           "null_share": round(1 - counts["values"] / rows, 4) if rows else None}
    return table, sorted(set(schema_categories) - set(table))


def build_report(meta: dict, total: Stats, this_run: Stats, attempts: list, current, schema_categories=()) -> dict:
    """The report as a JSON-able dict: counters of the whole job, time and cost summed over its
    ``attempts`` (pipelines.attempts.Attempt, ``current`` among them), ``this_run`` for ``current``;
    ``schema_categories``: the attribute schema's categories, for those without products."""
    products = total.counts["products_out"]
    kinds = sorted({a.device for a in attempts if a.devices} or {current.device})  # not attempts stopped before sizing
    device_seconds = sum(a.device_seconds for a in attempts)
    usd = sum(a.usd for a in attempts)
    run_products = this_run.counts["products_out"]
    run = {
        "chunks": this_run.chunks,
        "rows_in": this_run.counts["rows_in"],
        "products_out": run_products,
        "wall_seconds": round(current.wall_seconds, 3),
        "device": current.device,
        "devices": current.devices,
        "device_seconds": round(current.device_seconds, 3),
        "busy_device_seconds": round(this_run.busy_device_seconds, 3),
        "products_per_second_per_device": round(run_products / current.device_seconds, 3) if current.device_seconds and run_products else None,
        "price_per_hour": current.price_per_hour,
        "usd": round(current.usd, 6),
        "extract_actor_processes": len(this_run.actors),
    }
    report = dict(meta)
    report.update({name: total.counts[name] for name in COUNTERS})
    report["rows_rejected"] = total.counts["rejected"]
    report["rows_skipped"] = total.counts["skipped"]
    report["rejected_by_stage"] = dict(sorted(total.rejected_by_stage.items()))
    report["chunks"] = total.chunks
    prompts = total.counts["prompts"]
    stacked = products + total.rejected_by_stage.get("extract", 0)  # a failed prompt's products were stacked too
    report["products_per_prompt"] = round(stacked / prompts, 2) if prompts else None  # against J: how full prompts were
    report["attempts"] = len(attempts)
    report["resumed"] = len(attempts) > 1
    report["wall_seconds"] = round(sum(a.wall_seconds for a in attempts), 3)
    report["device"] = "+".join(kinds)
    report["devices"] = current.devices
    report["device_seconds"] = round(device_seconds, 3)  # GPU-seconds or vCPU-seconds (all attempts)
    for kind in kinds:
        report[f"{kind}_seconds"] = round(sum(a.device_seconds for a in attempts if a.device == kind), 3)
    report["busy_device_seconds"] = round(total.busy_device_seconds, 3)
    one_kind = len(kinds) == 1
    report["products_per_second_per_device"] = (
        round(products / device_seconds, 3) if one_kind and device_seconds and products else None
    )
    report["price_per_hour"] = current.price_per_hour
    report["price_unit"] = UNITS[current.device]
    report["usd"] = round(usd, 6)
    report["usd_per_1k_products"] = round(usd / products * 1000, 6) if products else None
    report["extract_actor_processes"] = len(total.actors)
    report["dtype"] = "+".join(sorted(total.dtypes)) or None  # None: no model ran (dry run, no products)
    report["spans"] = "+".join(sorted(total.spans)) or None  # span decoding that ran: on, off (or on+off); None: none ran
    report["compiled"] = "+".join(sorted(total.compiled)) or None  # the layers' compiled pieces: likewise
    report["by_category"], report["categories_without_products"] = by_category(total, schema_categories)
    report["this_run"] = run
    return report


def _or_na(value, prefix: str = "") -> str:
    return "n/a" if value is None else f"{prefix}{value}"


def render_markdown(report: dict) -> str:
    device = "+".join({"cpu": "vCPU", "gpu": "GPU"}[kind] for kind in report["device"].split("+"))
    lines = [
        f"# Extraction report `{report['run_id']}`",
        "",
        f"- input: `{report['input']}`  output: `{report['output']}`",
        f"- decoder: `{report['decoder']}`  model: `{report['model']}`"
        + (f" + adapter `{report['adapter']}`  " if report.get("adapter") else "  ")
        + f"J = {report['docs_per_prompt']}  K_max = {report['max_value_tokens']}"
        + (f"  dtype: {report['dtype']}" if report.get("dtype") else "")
        + (f"  spans: {report['spans']}" if report.get("spans") else "")
        + (f"  compiled layers: {report['compiled']}" if report.get("compiled") else "")
        + ("  confidence: on" if report.get("confidence") else ""),
        "",
        "| rows in | products out | rejected | skipped | attribute rows | texts cut to --max-text-chars |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {report['rows_in']} | {report['products_out']} | {report['rows_rejected']} "
        f"| {report['rows_skipped']} | {report['attribute_rows']} | {report.get('inputs_truncated', 0)} |",
        "",
        "Rejected by stage: "
        + (", ".join(f"{stage} {n}" for stage, n in report["rejected_by_stage"].items()) or "none"),
        "",
        "| prompts | prompt tokens | generated tokens | forward passes | truncated values | parse errors "
        "| values not in text | values beyond the sliding window |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {report['prompts']} | {report['prompt_tokens']} | {report['generated_tokens']} "
        f"| {report['forward_passes']} | {report['values_truncated']} | {report['parse_errors']} "
        f"| {report['values_not_in_text']} | {report.get('values_beyond_window', 0)} |",
        "",
        f"Products per prompt: {_or_na(report.get('products_per_prompt'))} (J = {report['docs_per_prompt']})"
        + (f"; {report['prompts_in_groups']} prompts too wide for the model's sliding window decoded as attribute "
           "groups." if report.get("prompts_in_groups") else "."),
        "",
        f"Whole job ({report['attempts']} attempt{'s' if report['attempts'] != 1 else ''}"
        f"{', resumed' if report['resumed'] else ''}): {report['products_out']} products in {report['wall_seconds']} s, "
        f"{report['device_seconds']} {device}-seconds ({report['busy_device_seconds']} of them busy decoding), "
        f"{_or_na(report['products_per_second_per_device'])} products/s per {device}, "
        f"{_or_na(report['usd_per_1k_products'], '$')} per 1k products (${report['usd']} in all) "
        f"at ${report['price_per_hour']} per {report['price_unit']}.",
        "",
        f"This run: {report['this_run']['products_out']} products in {report['this_run']['wall_seconds']} s on "
        f"{report['this_run']['devices']} {'GPU' if report['this_run']['device'] == 'gpu' else 'vCPU'}.",
        "",
    ]
    lines += _category_lines(report)
    if report.get("batches_fixed_steps") or report.get("batches_packed_steps"):
        lines += [f"Engine batches: {report.get('batches_fixed_steps', 0)} with fixed steps, "
                  f"{report.get('batches_packed_steps', 0)} with packed steps (--step-shape).", ""]
    if report.get("cuda_graph_failures"):
        lines += [f"CUDA graph captures failed: {report['cuda_graph_failures']} (those batches ran their steps eagerly: "
                  "the same values, slower; the actors' logs say why).", ""]
    return "\n".join(lines)


CATEGORY_ROWS_SHOWN = 50  # the markdown's per-category table: the categories of most products (all in the JSON)
NAMES_SHOWN = 20


def _category_lines(report: dict) -> list[str]:
    table, missing = report.get("by_category"), report.get("categories_without_products")
    if not table and not missing:  # a report of a job resumed from older chunks, or one of no products
        return []
    lines = []
    if table:
        ranked = sorted(table.items(), key=lambda item: (-item[1]["products"], item[0]))
        lines += ["| category | products | values written | attribute rows | null share |", "|---|---:|---:|---:|---:|"]
        for name, row in ranked[:CATEGORY_ROWS_SHOWN]:
            share = "n/a" if row["null_share"] is None else f"{row['null_share']:.1%}"
            name = name.replace("|", "\\|")  # a category's own | must not end its cell
            lines.append(f"| {name} | {row['products']} | {row['values']} | {row['attribute_rows']} | {share} |")
        if len(ranked) > CATEGORY_ROWS_SHOWN:
            lines.append(f"\n{len(ranked) - CATEGORY_ROWS_SHOWN} more categories in `_report.json` (`by_category`).")
        lines.append("")
    if missing:
        lines += [f"Schema categories without products ({len(missing)}): "
                  + ", ".join(missing[:NAMES_SHOWN]) + (" ..." if len(missing) > NAMES_SHOWN else "")
                  + " (not in this input, or spelt otherwise in its records: `hpd rejected` lists unknown ones).", ""]
    return lines


def write_report(output_uri: str, report: dict) -> None:
    """``_report.md``, then ``_report.json``: the JSON marks the job finished (a re-run does nothing), so
    it is written last; a kill between the two leaves a job that is not yet finished, not one without
    its ``_report.md``."""
    io.write_bytes(io.join(output_uri, "_report.md"), render_markdown(report).encode())
    io.write_json(io.join(output_uri, "_report.json"), report)


def ensure_markdown(output_uri: str, report: dict) -> None:
    """Write a finished job's ``_report.md`` again from its ``_report.json`` if it is missing (a job
    killed between the two by a version that wrote the JSON first)."""
    markdown = io.join(output_uri, "_report.md")
    if not io.exists(markdown):
        io.write_bytes(markdown, render_markdown(report).encode())
