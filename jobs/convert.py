"""`hpd convert extractgpt FILE.jsonl --out DIR`: benchmark JSONL -> records, attribute schema, gold.

The conversion itself is ``evaluation.convert``; this module is its command line. The last stdout
line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.convert import FORMATS, ConvertConfig, convert, default_names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, help="input format")
    parser.add_argument("file", type=Path, help="ExtractGPT JSON Lines: {input, category, target_scores} per line, "
                        "e.g. ExtractGPT's data/processed_datasets/oa-mine/test.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--dataset", help="dataset name in product ids (default: parent folder name)")
    parser.add_argument("--split", help="split name in product ids (default: file stem)")
    parser.add_argument(
        "--per-category",
        type=int,
        metavar="N",
        help="keep only the first N products of each category (a quick subset; ids and attributes unchanged)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.file.is_file():
        raise ValueError(f"input file not found: {args.file}")
    dataset, split = default_names(args.file)
    config = ConvertConfig(
        args.file,
        args.out,
        dataset if args.dataset is None else args.dataset,
        split if args.split is None else args.split,
        args.per_category,
    )
    converted = convert(config)
    for warning in converted.warnings:
        print(f"hpd convert: warning: {warning}", file=sys.stderr)
    summary = {
        "records": len(converted.records),
        "categories": len(converted.attributes),
        "attributes": sum(len(names) for names in converted.attributes.values()),
        "first_product_id": converted.records[0]["product_id"],
        "out": str(config.out_dir),
    }
    print(json.dumps(summary))
    return 0
