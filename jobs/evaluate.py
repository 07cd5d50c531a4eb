"""`hpd evaluate`: score extraction output against gold (ExtractGPT metric + strict variant).

Two modes:

- ``hpd evaluate --predictions URI --gold gold.jsonl [--attributes attributes.json]`` reads
  ``URI/attributes/`` (the extraction job's Parquet, see ``datafiles.predictions``), local or
  ``s3://bucket/prefix``, joins it to the gold of ``hpd convert`` by product_id (see
  ``evaluation.scoring``), prints one JSON summary as the last stdout line and writes
  ``URI/_evaluation.json`` and ``URI/_evaluation.md`` (see ``evaluation.report``).
- ``hpd evaluate --extractgpt-run RUN.gz`` recomputes a stored ExtractGPT run and checks it
  against the run's stored ``results``; exit status 1 when they differ.

Bad input raises ``ValueError`` naming the file (and line); ``hpd`` prints it without a traceback.
"""

from __future__ import annotations

import argparse
import json

from datafiles.dataset import read_attributes, read_gold
from datafiles.predictions import read_predictions
from evaluation.report import write_reports
from evaluation.scoring import evaluate, evaluate_extractgpt_run


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
