"""`hpd pick OUTPUT --input RECORDS --attributes FILE --count N --out FOLDER`: the products of a
catalog to label first, for `hpd finetune --init-adapter default`.

The choice is ``training.selection`` (a share per category, a seeded sample within it); this
module reads an `hpd extract` output and its input, and writes an `hpd convert`-style folder: ``records.jsonl`` (the chosen products' records as they were),
``attributes.json`` and ``gold-draft.jsonl`` (the model's values, to correct and save as
``gold.jsonl``). The counts go to stderr, the last stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE, RECORDS_FILE
from pipelines.schema import id_of, load_schema
from training.selection import SelectionConfig, draft, select

DRAFT_FILE = "gold-draft.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="an `hpd extract` output of the catalog (local or s3://): the products it wrote "
                        "are the candidates, and its values the draft")
    parser.add_argument("--input", required=True, type=Path, help="that job's input records (a local .jsonl or .parquet file)")
    parser.add_argument("--attributes", required=True, type=Path, help="that job's attribute schema")
    parser.add_argument("--count", required=True, type=int, help="products to pick")
    parser.add_argument("--out", required=True, type=Path, help="a new or empty folder for records.jsonl, attributes.json "
                        f"and {DRAFT_FILE}")
    defaults = SelectionConfig(1)
    parser.add_argument("--min-per-category", type=int, default=defaults.min_per_category,
                        help=f"at least this many of each category (default: {defaults.min_per_category})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help=f"of the sample (default: {defaults.seed})")


def run(args: argparse.Namespace) -> int:
    from datafiles.predictions import read_predictions
    from training.data import read_records

    config = SelectionConfig(args.count, args.min_per_category, args.seed)
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise ValueError(f"--out {args.out} is not a new or empty folder")
    if not args.input.is_file():
        raise ValueError(f"--input {args.input} is not a file (a .jsonl or .parquet file of records)")
    schema = load_schema(str(args.attributes))
    predictions = read_predictions(args.output)
    records = {}
    for record in read_records(args.input):
        if isinstance(record, dict):
            product_id = id_of(record.get("product_id"))
            if product_id in predictions.values and product_id not in records:
                records[product_id] = record
    if not records:
        raise ValueError(f"no product of {args.output} is in --input {args.input}: pass the job's own input")
    products = [(product_id, str(record.get("category"))) for product_id, record in records.items()]
    chosen = select(products, config)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / RECORDS_FILE, "w", encoding="utf-8") as out:
        for product_id in chosen:
            out.write(json.dumps(records[product_id], ensure_ascii=False, default=str) + "\n")
    shutil.copyfile(args.attributes, args.out / ATTRIBUTES_FILE)
    categories = dict(products)
    with open(args.out / DRAFT_FILE, "w", encoding="utf-8") as out:
        for product_id in chosen:
            category = categories[product_id]
            names = [a.name for a in schema.categories.get(category, ())]
            out.write(json.dumps(draft(product_id, category, predictions.values[product_id], names), ensure_ascii=False) + "\n")

    per_category = Counter(categories[p] for p in chosen)
    print(f"hpd pick: {len(chosen)} of {len(products)} products (seed {config.seed}): "
          + ", ".join(f"{c} {n}" for c, n in sorted(per_category.items())), file=sys.stderr)
    print(f"  correct {args.out / DRAFT_FILE} (the model's values; n/a: none) and save it as {args.out / 'gold.jsonl'}, "
          f"then: hpd finetune --train {args.out} --init-adapter default --dtype auto --out ADAPTER", file=sys.stderr)
    print(json.dumps({"picked": len(chosen), "of": len(products), "seed": config.seed,
                      "per_category": dict(sorted(per_category.items())), "out": str(args.out)}))
    return 0
