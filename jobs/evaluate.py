"""`hpd evaluate`: score extraction output against gold (ExtractGPT metric + strict variant).

Two modes:

- ``hpd evaluate --predictions URI --gold gold.jsonl [--attributes attributes.json]`` reads
  ``URI/attributes/`` (the extraction job's Parquet, see ``jobs.predictions``), local or
  ``s3://bucket/prefix``, joins it to the gold of ``hpd convert`` by product_id (see
  ``jobs.scoring``), prints one JSON summary as the last stdout line and writes
  ``URI/_evaluation.json`` and ``URI/_evaluation.md`` (see ``jobs.evaluation_report``).
- ``hpd evaluate --extractgpt-run RUN.gz`` recomputes a stored ExtractGPT run and checks it
  against the run's stored ``results``; exit status 1 when they differ.

Bad input raises ``ValueError`` naming the file (and line); ``hpd`` prints it without a traceback.
"""

from __future__ import annotations

import argparse
import json

from jobs.convert import validate_target_scores
from jobs.metrics import GoldExample
from jobs.predictions import read_predictions
from jobs.evaluation_report import write_reports
from jobs.scoring import evaluate, evaluate_extractgpt_run
from jobs.storage import read_jsonl, read_text


def read_gold(uri: str) -> list[GoldExample]:
    """gold.jsonl of ``hpd convert``: ``{"product_id", "category", "target_scores"}`` per line."""
    examples: list[GoldExample] = []
    seen: set[str] = set()
    for number, row in read_jsonl(uri):
        where = f"{uri} line {number}"
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
    """category -> attribute names, from an attribute schema file (local or s3://) in the formats
    the extraction job reads (``pipelines.schema``)."""
    from pipelines.schema import schema_from_text

    schema = schema_from_text(read_text(uri), uri)
    return {category: [a.name for a in attributes] for category, attributes in schema.categories.items()}


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
