"""`hpd convert extractgpt FILE.jsonl --out DIR`: benchmark JSONL -> records, attribute schema, gold;
`hpd convert labels FOLDER/labels.csv --out FOLDER`: a corrected labelling sheet -> gold.jsonl.

The conversions are ``evaluation.convert`` and ``datafiles.labels``; this module is their command
line. The last stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE, GOLD_FILE, RECORDS_FILE, read_attributes, read_records
from evaluation.convert import FORMATS, ConvertConfig, convert, default_names

LABELS = "labels"  # hpd pick's sheet (datafiles/labels.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=(*FORMATS, LABELS), help="input format: extractgpt (a benchmark file) or "
                        "labels (the labelling sheet of `hpd pick`, corrected)")
    parser.add_argument("file", type=Path, help="ExtractGPT JSON Lines: {input, category, target_scores} per line, "
                        "e.g. ExtractGPT's data/processed_datasets/oa-mine/test.jsonl; or, with labels, the sheet "
                        "(labels.csv), whose folder holds the sample's records.jsonl and attributes.json")
    parser.add_argument("--out", type=Path, required=True, help=f"output directory (with labels: where {GOLD_FILE} goes, "
                        "replacing one there; usually the sheet's folder)")
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
    if args.format == LABELS:
        return run_labels(args)
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


def run_labels(args: argparse.Namespace) -> int:
    """A corrected sheet -> ``--out``/gold.jsonl, against the records and schema beside the sheet."""
    from datafiles.labels import gold_text, read_sheet

    if given := [flag for flag, value in (("--dataset", args.dataset), ("--split", args.split),
                                          ("--per-category", args.per_category)) if value is not None]:
        raise ValueError(f"{', '.join(given)}: options of the extractgpt format, not of labels")
    folder = args.file.parent
    for name in (RECORDS_FILE, ATTRIBUTES_FILE):
        if not (folder / name).is_file():
            raise ValueError(f"{folder / name} not found: the sheet must lie in the folder `hpd pick` wrote it to, "
                             f"beside the sample's {RECORDS_FILE} and {ATTRIBUTES_FILE}")
    records = {row["product_id"]: row for row in read_records(folder / RECORDS_FILE)}
    try:
        text = args.file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{args.file} is not UTF-8 text (byte 0x{err.object[err.start:err.start + 1].hex()} at byte "
                         f"{err.start}): save it from the spreadsheet program as \"CSV UTF-8\"") from err
    sheet = read_sheet(text, str(args.file), records, read_attributes(str(folder / ATTRIBUTES_FILE)))
    for warning in sheet.warnings:
        print(f"hpd convert: warning: {warning}", file=sys.stderr)
    if not sheet.gold:
        raise ValueError(f"{args.file} has no rows: nothing to convert")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / GOLD_FILE
    replaced = out.exists()
    out.write_text(gold_text(sheet.gold), encoding="utf-8")
    values = sum(1 for line in sheet.gold for v in line["target_scores"].values() if "n/a" not in v)
    print(f"hpd convert: {len(sheet.gold)} products, {values} values: {out}{' (replaced)' if replaced else ''}; "
          f"train with: hpd finetune --train {folder}{'' if args.out.resolve() == folder.resolve() else f' --gold {out}'} "
          "--init-adapter default --dtype auto --out ADAPTER", file=sys.stderr)
    print(json.dumps({"products": len(sheet.gold), "values": values, "warnings": len(sheet.warnings), "out": str(out)}))
    return 0
