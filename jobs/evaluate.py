"""`hpd evaluate`: score extraction output against gold (ExtractGPT metric + strict variant).

Two modes:

- ``hpd evaluate --predictions URI --gold gold.jsonl [--attributes attributes.json]`` reads
  ``URI/attributes/`` (the extraction job's hive-partitioned Parquet: product_id, category,
  attribute, value, truncated, ...), local or ``s3://bucket/prefix``, joins it to the gold of
  ``hpd convert`` by product_id, prints one JSON summary as the last stdout line and writes
  ``URI/_evaluation.json`` and ``URI/_evaluation.md`` (per-category, per-attribute table).
- ``hpd evaluate --extractgpt-run RUN.gz`` recomputes a stored ExtractGPT run and checks it
  against the run's stored ``results``; exit status 1 when they differ.

Scoring always uses the GOLD category of a product. Each file is read on its own
(``partitioning=None``), so the ``category`` column stored in the files is never shadowed by the
path-safe ``category=<escaped>`` directory; when a file has no ``category`` column the directory
value (URL-unquoted) stands in. Predicted categories only feed the ``category_mismatch`` count.
Gold products without any prediction row count as predicting null for every attribute.
S3 settings come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN and AWS_REGION (or AWS_DEFAULT_REGION).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from jobs.convert import validate_target_scores
from jobs.metrics import (
    Counts,
    GoldExample,
    MetricReport,
    extractgpt_metric,
    parse_extractgpt_prediction,
    score_counts,
    strict_metric,
)

PREDICTIONS_DIR = "attributes"
REPORT_JSON = "_evaluation.json"
REPORT_MD = "_evaluation.md"
REQUIRED_COLUMNS = ("product_id", "attribute", "value")
PARTITION_KEY = "category"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Predictions:
    """Prediction rows folded to product_id -> attribute -> value, plus what was seen on the way."""

    values: dict[str, dict[str, object]]
    categories: dict[str, str | None]  # product_id -> predicted category
    rows: int
    files: int
    truncated: int = 0


@dataclass(frozen=True)
class EvaluationResult:
    """Both metric reports and the join statistics."""

    lenient: MetricReport
    strict: MetricReport
    products: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        return {
            **self.lenient.to_dict(with_combos=False),
            "strict": self.strict.to_dict(with_combos=False),
            "combos": len(self.lenient.combos),
            "products": self.products,
        }


# --- file systems -----------------------------------------------------------------------------


def s3_options(env: Mapping[str, str]) -> dict[str, str]:
    """Keyword arguments for ``pyarrow.fs.S3FileSystem`` from AWS_* environment variables."""
    options: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint)
        if parsed.scheme in ("http", "https") and parsed.netloc:
            options["scheme"] = parsed.scheme
            options["endpoint_override"] = parsed.netloc
        else:
            options["endpoint_override"] = endpoint
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options["access_key"] = env["AWS_ACCESS_KEY_ID"]
        options["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            options["session_token"] = env["AWS_SESSION_TOKEN"]
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return options


def resolve(uri: str):
    """``(pyarrow FileSystem, path)`` for a local path, ``file://`` or ``s3://bucket/prefix`` URI."""
    from pyarrow import fs

    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"S3 URI needs a bucket: {uri!r} (expected s3://bucket/prefix)")
        return fs.S3FileSystem(**s3_options(os.environ)), f"{parsed.netloc}{parsed.path}".rstrip("/")
    if parsed.scheme == "file":
        return fs.LocalFileSystem(), os.path.abspath(parsed.path)
    if parsed.scheme:
        raise ValueError(f"unsupported URI scheme {parsed.scheme!r} in {uri!r}: use a local path or s3://")
    return fs.LocalFileSystem(), os.path.abspath(uri)


def read_text(uri: str) -> str:
    """Whole file as UTF-8 text; gzip (detected by its magic bytes) is decompressed."""
    filesystem, path = resolve(uri)
    with filesystem.open_input_stream(path, compression=None) as stream:
        data = stream.read()
    return (gzip.decompress(data) if data[:2] == GZIP_MAGIC else data).decode("utf-8")


# --- inputs -----------------------------------------------------------------------------------


def read_gold(uri: str) -> list[GoldExample]:
    """gold.jsonl of ``hpd convert``: ``{"product_id", "category", "target_scores"}`` per line."""
    examples: list[GoldExample] = []
    seen: set[str] = set()
    for number, line in enumerate(read_text(uri).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{uri} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg})") from err
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object")
        for key in ("product_id", "category"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise ValueError(f"{where}: '{key}' must be a non-empty string (is this a gold.jsonl from hpd convert?)")
        if row["product_id"] in seen:
            raise ValueError(f"{where}: duplicate product_id {row['product_id']!r}")
        seen.add(row["product_id"])
        target_scores = validate_target_scores(row.get("target_scores"), where)
        examples.append(GoldExample(row["product_id"], row["category"], target_scores))
    if not examples:
        raise ValueError(f"{uri}: no gold rows")
    return examples


def read_attributes(uri: str) -> dict[str, list[str]]:
    """Attribute schema: ``{category: [name | {"name": ...}]}`` or ``{category: {name: description}}``;
    JSON for ``.json``, YAML otherwise (as the extraction job's schema files)."""
    text = read_text(uri)
    if uri.lower().endswith(".json"):
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{uri}: not valid JSON ({err})") from err
    else:
        import yaml

        try:
            schema = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{uri}: not valid YAML ({err})") from err
    if not isinstance(schema, dict):
        raise ValueError(f"{uri}: expected an object mapping category -> attribute list")
    out: dict[str, list[str]] = {}
    for category, entries in schema.items():
        if isinstance(entries, dict):
            entries = list(entries)
        if not isinstance(entries, list):
            raise ValueError(f"{uri}: attributes of {category!r} must be a list or an object")
        names = [e.get("name") if isinstance(e, dict) else e for e in entries]
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"{uri}: attributes of {category!r} must be names or {{'name': ...}} objects")
        out[category] = names
    return out


def _partition_category(path: str) -> str | None:
    """The URL-unquoted value of the innermost ``category=...`` directory in ``path``, if any."""
    values = [unquote(part.split("=", 1)[1]) for part in path.split("/") if part.startswith(f"{PARTITION_KEY}=")]
    return values[-1] if values else None


def read_predictions(uri: str) -> Predictions:
    """Read every Parquet file under ``URI/attributes/`` (see module doc for the category rule)."""
    import pyarrow.dataset as ds

    filesystem, base = resolve(uri)
    root = f"{base}/{PREDICTIONS_DIR}"
    try:
        dataset = ds.dataset(root, filesystem=filesystem, format="parquet", partitioning=None)
        fragments = list(dataset.get_fragments())
    except FileNotFoundError as err:
        raise ValueError(f"no predictions at {uri}/{PREDICTIONS_DIR}/: pass the output directory of `hpd extract`") from err
    if not fragments:
        raise ValueError(f"no Parquet files under {uri}/{PREDICTIONS_DIR}/: pass the output directory of `hpd extract`")
    values: dict[str, dict[str, object]] = {}
    categories: dict[str, str | None] = {}
    rows = truncated = 0
    for fragment in fragments:
        schema = fragment.physical_schema
        missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
        if missing:
            raise ValueError(f"{fragment.path}: missing column(s) {missing}; expected {list(REQUIRED_COLUMNS)}")
        columns = [c for c in (*REQUIRED_COLUMNS, "category", "truncated") if c in schema.names]
        table = fragment.to_table(schema=schema, columns=columns).to_pydict()
        n_rows = len(table["product_id"])
        file_categories = table.get("category", [_partition_category(fragment.path)] * n_rows)
        for i, (product_id, attribute, value) in enumerate(zip(table["product_id"], table["attribute"], table["value"])):
            per_product = values.setdefault(product_id, {})
            if attribute in per_product:
                raise ValueError(f"{fragment.path}: duplicate prediction for product {product_id!r}, attribute {attribute!r}")
            per_product[attribute] = value
            categories.setdefault(product_id, file_categories[i])
        truncated += sum(1 for flag in table.get("truncated", ()) if flag)
        rows += n_rows
    return Predictions(values, categories, rows, len(fragments), truncated)


# --- scoring and reports ----------------------------------------------------------------------


def evaluate(
    predictions: Predictions,
    gold: list[GoldExample],
    attributes: Mapping[str, list[str]] | None = None,
) -> EvaluationResult:
    """Join by product_id and compute both metrics; missing products predict null."""
    gold_ids = {ex.product_id for ex in gold}
    products = {
        "gold": len(gold),
        "predicted": sum(1 for pid in predictions.values if pid in gold_ids),
        "missing": sum(1 for ex in gold if ex.product_id not in predictions.values),
        "extra": sum(1 for pid in predictions.values if pid not in gold_ids),
        "category_mismatch": sum(
            1 for ex in gold if predictions.categories.get(ex.product_id, ex.category) not in (None, ex.category)
        ),
        "rows": predictions.rows,
        "truncated": predictions.truncated,
    }
    return EvaluationResult(
        extractgpt_metric(gold, predictions.values, attributes),
        strict_metric(gold, predictions.values, attributes),
        products,
    )


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


def evaluate_extractgpt_run(uri: str) -> dict:
    """Recompute a stored ExtractGPT run (gzip JSON) and compare with its stored ``results``."""
    run = json.loads(read_text(uri))
    if not isinstance(run, dict) or not isinstance(run.get("examples"), list):
        raise ValueError(f"{uri}: not an ExtractGPT run (expected an object with 'examples')")
    gold, predictions = [], {}
    for i, example in enumerate(run["examples"]):
        product_id = f"example-{i:05d}"
        if not isinstance(example, dict) or not isinstance(example.get("category"), str):
            raise ValueError(f"{uri} example {i}: expected an object with a string 'category'")
        target_scores = validate_target_scores(example.get("target_scores"), f"{uri} example {i}")
        gold.append(GoldExample(product_id, example["category"], target_scores))
        predictions[product_id] = parse_extractgpt_prediction(example.get("pred"))
    attributes = run.get("known_attributes")
    lenient = extractgpt_metric(gold, predictions, attributes)
    strict = strict_metric(gold, predictions, attributes)
    stored = run.get("results") or {}
    mine = lenient.to_dict(with_combos=False)
    matches = {
        kind: {f"{kind}_{k}": v for k, v in mine[kind].items()} == stored.get(kind) for kind in ("micro", "macro")
    }
    stored_combos = {k: v for k, v in stored.items() if k not in ("micro", "macro")}
    matches["combos"] = stored_combos == {f"{c.attribute}_{c.category}": c.scores.to_dict() for c in lenient.combos}
    return {
        "run": uri,
        "model": run.get("model"),
        "dataset": run.get("dataset_name"),
        "examples": len(gold),
        **mine,
        "strict": strict.to_dict(with_combos=False),
        "combos": len(lenient.combos),
        "stored": {"micro": stored.get("micro"), "macro": stored.get("macro")},
        "matches_stored": matches,
    }


# --- CLI --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--predictions", metavar="URI", help="output directory of `hpd extract` (local or s3://), containing attributes/")
    parser.add_argument("--gold", metavar="FILE", help="gold.jsonl written by `hpd convert`")
    parser.add_argument("--attributes", metavar="FILE", help="attribute schema (attributes.json); widens the strict variant")
    parser.add_argument("--extractgpt-run", metavar="FILE.gz", help="recompute a stored ExtractGPT run instead")
    parser.add_argument("--no-write", action="store_true", help="do not write _evaluation.{json,md} next to the predictions")


def run(args: argparse.Namespace) -> int:
    if args.extractgpt_run:
        if args.predictions or args.gold or args.attributes:
            raise ValueError("--extractgpt-run cannot be combined with --predictions/--gold/--attributes")
        result = evaluate_extractgpt_run(args.extractgpt_run)
        print(json.dumps(result, ensure_ascii=False))
        return 0 if all(result["matches_stored"].values()) else 1
    if not args.predictions or not args.gold:
        raise ValueError("pass --predictions URI and --gold FILE (or --extractgpt-run FILE.gz)")
    gold = read_gold(args.gold)
    attributes = read_attributes(args.attributes) if args.attributes else None
    result = evaluate(read_predictions(args.predictions), gold, attributes)
    extra = {"predictions": args.predictions, "gold": args.gold, "attributes": args.attributes}
    summary = {**extra, **result.summary()}
    if not args.no_write:
        summary["report_json"], summary["report_md"] = write_reports(args.predictions, result, extra)
    print(json.dumps(summary, ensure_ascii=False))
    return 0
