"""`hpd evaluate`: score extraction output against gold (ExtractGPT metric + strict variant).

Two modes:

- ``hpd evaluate --predictions URI --gold gold.jsonl [--attributes attributes.json]`` reads
  ``URI/attributes/`` (the extraction job's Parquet, see ``datafiles.predictions``), local or
  ``s3://bucket/prefix``, joins it to the gold of ``hpd convert`` by product_id (see
  ``evaluation.scoring``), prints one JSON summary as the last stdout line and writes
  ``URI/_evaluation.json`` and ``URI/_evaluation.md`` (see ``evaluation.report``). Of the output it
  holds the values of the gold's products (and of the records', for the leakage figure) alone,
  reading it a file at a time (``read_predictions(uri, only=...)``): an output of any size.
- ``hpd evaluate --extractgpt-run RUN.gz`` recomputes a stored ExtractGPT run and checks it
  against the run's stored ``results``; exit status 1 when they differ.

Bad input raises ``ValueError`` naming the file (and line); ``hpd`` prints it without a traceback
and exits 2. Predictions that share no product id with the gold are such an error (nothing would
be scored).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from datafiles.dataset import RECORDS_FILE, read_attributes, read_gold, read_records, unknown_attributes
from datafiles.storage import exists, read_text
from evaluation import compare, leakage
from datafiles.predictions import Predictions, read_predictions
from evaluation.report import write_reports
from evaluation.scoring import evaluate, evaluate_extractgpt_run
from pipelines.schema import id_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--predictions", metavar="URI", help="output directory of `hpd extract` (local or s3://), containing attributes/ (required unless --extractgpt-run)")
    parser.add_argument("--gold", metavar="FILE", help="gold.jsonl: {product_id, category, target_scores: {attribute: {value: 1}}} per line, "
                        "as `hpd convert` writes it (required unless --extractgpt-run)")
    parser.add_argument("--attributes", metavar="FILE", help="attribute schema (attributes.json); widens the strict variant")
    parser.add_argument("--extractgpt-run", metavar="FILE.gz", help="recompute a stored ExtractGPT run instead")
    parser.add_argument("--records", metavar="FILE",
                        help="the job's input records, for the leakage figure (default: records.jsonl beside --gold)")
    parser.add_argument("--docs-per-prompt", type=int, metavar="J",
                        help="J the predictions were made with, for the leakage figure (default: from their _report.json)")
    parser.add_argument("--no-write", action="store_true", help="do not write _evaluation.{json,md} next to the predictions")
    parser.add_argument("--predicted-only", action="store_true",
                        help="score only the gold products the predictions hold (a job on part of the input, such as the "
                        "quickstart's sample); without it, a gold product with no prediction counts as all misses")
    parser.add_argument("--compare", metavar="URI",
                        help="another run's output on the same products: add a paired bootstrap of the micro F1 "
                        "difference (--predictions minus this; evaluation/compare.py)")
    parser.add_argument("--draws", type=int, default=2000, help="bootstrap draws for --compare (default: 2000)")


def check_ids_match(predicted: Predictions, gold: list, predictions_uri: str, gold_uri: str) -> None:
    """Scoring predictions that share no product id with the gold would print 0.00 for a mistake
    (e.g. records and gold from different conversions): refuse, showing an id of each. ``predicted``
    holds the values of every gold product it has (``read_predictions(uri, only=...)``)."""
    gold_ids = sorted(example.product_id for example in gold)
    if predicted.products and not any(product_id in predicted.values for product_id in gold_ids):
        raise ValueError(
            f"none of the {predicted.products} product ids in {predictions_uri} is among the {len(gold_ids)} gold ids in "
            f"{gold_uri} (e.g. {predicted.least_id!r} vs {gold_ids[0]!r}): score the output of a job whose input came "
            "from the same `hpd convert` run as this gold"
        )


def warn_unknown_attributes(gold: list, attributes: dict | None, predictions, args: argparse.Namespace) -> None:
    """Gold attributes that are not the schema's (``--attributes``; without it, those the predictions
    hold for the category) cannot be predicted: ``brand`` for ``Brand`` scores every such value as a
    miss. A score of what was given is still a score, so this warns (counts, the first line, and a
    name that differs only in case) rather than refusing."""
    if attributes is not None:
        known, source = attributes, f"the schema {args.attributes}"
    else:  # the names of the whole output's values per category, not only the gold products'
        known, source = predictions.attributes, f"the predictions in {args.predictions}"
    found = [(ex, names) for ex in gold if ex.category in known and (names := unknown_attributes(ex, known[ex.category]))]
    if not found:
        return
    example, names = found[0]
    slots = sum(len(names) for _, names in found)
    print(f"hpd evaluate: warning: {len(found)} of {len(gold)} gold products name {slots} attribute(s) that {source} "
          f"does not have for their category (e.g. {args.gold} line {example.line}, category {example.category!r}: "
          f"{', '.join(names)}; it has {', '.join(sorted(known[example.category]))}); their gold values count as misses: "
          "write the attribute names exactly as the schema does (case too)", file=sys.stderr)


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
    records = _leakage_records(args)  # (records, J), or None: no leakage figure
    # the values of the gold products, and of the records' for the leakage figure, are all that is held
    # of the predictions (an output of any size: the README's "Your own catalog")
    wanted = {example.product_id for example in gold}
    if records is not None:
        wanted |= {id_of(record["product_id"]) for record in records[0]}
    predictions = read_predictions(args.predictions, only=wanted)
    check_ids_match(predictions, gold, args.predictions, args.gold)
    unpredicted = sum(1 for example in gold if example.product_id not in predictions.values)
    if args.predicted_only:
        gold = [example for example in gold if example.product_id in predictions.values]
    elif unpredicted:
        print(f"hpd evaluate: warning: {unpredicted} of {len(gold)} gold products have no predictions in "
              f"{args.predictions} and count as misses (a job on part of the input? --predicted-only scores the "
              f"{len(gold) - unpredicted} predicted ones)", file=sys.stderr)
    warn_unknown_attributes(gold, attributes, predictions, args)
    result = evaluate(predictions, gold, attributes)
    if mismatch := result.products["category_mismatch"]:
        example = next(ex for ex in gold if predictions.categories.get(ex.product_id, ex.category) not in (None, ex.category))
        print(f"hpd evaluate: warning: {mismatch} product(s) have another category in the predictions than in the gold "
              f"(e.g. {example.product_id!r}: {predictions.categories[example.product_id]!r} predicted, {example.category!r} "
              "in the gold); they are scored against the gold's attributes: were records and gold converted together?",
              file=sys.stderr)
    extra = {"predictions": args.predictions, "gold": args.gold, "attributes": args.attributes}
    if records is not None:
        extra["leakage"] = leakage.measure(predictions.values, *records).to_dict()
    if args.compare:
        extra["compare"] = _compare(args, gold, predictions)
    summary = {**extra, **result.summary()}
    if not args.no_write:
        summary["report_json"], summary["report_md"] = write_reports(args.predictions, result, extra)
    print(json.dumps(summary, ensure_ascii=False))
    return 0


def _compare(args: argparse.Namespace, gold: list, predictions) -> dict:
    other = read_predictions(args.compare, only={example.product_id for example in gold})
    check_ids_match(other, gold, args.compare, args.gold)
    result = compare.compare(compare.product_counts(gold, predictions.values), compare.product_counts(gold, other.values),
                             draws=args.draws)
    return {"against": args.compare, **{k: round(v, 4) if isinstance(v, float) else v
                                        for k, v in dataclasses.asdict(result).items()}}


def _leakage_records(args: argparse.Namespace) -> tuple[list, int] | None:
    """The records and J for the leakage figure (evaluation.leakage), when both are known."""
    records_path = Path(args.records) if args.records else Path(args.gold).with_name(RECORDS_FILE)
    if not records_path.is_file():
        if args.records:
            raise ValueError(f"--records {records_path} does not exist")
        return None
    docs = args.docs_per_prompt
    report = f"{args.predictions.rstrip('/')}/_report.json"
    if docs is None and exists(report):
        docs = json.loads(read_text(report)).get("docs_per_prompt")
    if docs is None:
        return None
    return read_records(records_path), docs
