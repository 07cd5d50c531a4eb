"""`hpd pick OUTPUT --input RECORDS --attributes FILE --count N --out FOLDER`: a sample of a
catalog's products to label, for `hpd finetune --init-adapter default`.

The choice is ``training.selection`` (a share per category, a seeded sample within it); this
module reads an `hpd extract` output and its input, and writes an `hpd convert`-style folder:
``records.jsonl`` (the chosen products' records as they were), ``attributes.json`` and
``gold-draft.jsonl`` (the model's values, to correct and save as ``gold.jsonl``). The input is the
job's own (``_job.json`` names it, and its ``--limit``), local or ``s3://``, a file or a prefix,
read as the job read it: the records are checked as the job checked them (the first valid copy of
an id is the product), and the schema must be the job's. It holds the output's values and the
records of its products, and reads the input only until it has found every product of the output:
pick from the output of a part of a large catalog (`hpd extract --limit`, or a sample file). The
counts go to stderr, the last stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE, GOLD_DRAFT_FILE, RECORDS_FILE, gold_draft
from pipelines.reader import ReadConfig
from pipelines.schema import Accepted, ValidationConfig, id_of, load_schema, schema_file_text, validate_record
from training.selection import SelectionConfig, select

DRAFT_FILE = GOLD_DRAFT_FILE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="an `hpd extract` output of the catalog (local or s3://): the products it wrote "
                        "are the candidates, and its values the draft")
    parser.add_argument("--input", help="that job's input records (default: the input its _job.json names, with its "
                        "--limit): a file or prefix, local or s3://, as `hpd extract --input` takes; a copy of it will do")
    parser.add_argument("--attributes", required=True, help="that job's attribute schema")
    parser.add_argument("--count", required=True, type=int, help="products to pick")
    parser.add_argument("--out", required=True, type=Path, help="a new or empty folder for records.jsonl, attributes.json "
                        f"and {DRAFT_FILE}")
    defaults = SelectionConfig(1)
    parser.add_argument("--min-per-category", type=int, default=defaults.min_per_category,
                        help=f"at least this many of each category (default: {defaults.min_per_category})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help=f"of the sample (default: {defaults.seed})")


def job_settings(output: str, schema, predictions, given: str | None) -> tuple[ValidationConfig, ReadConfig]:
    """The job's record checks (``--oversize``, ``--max-text-chars``) and its input as it read it
    (``--input`` if given, else the job's; the job's ``--limit``), from its ``_job.json``. The
    schema must be the job's: by the digest ``_job.json`` keeps (jobs.config), else by the
    categories and attributes of its values (an output without ``_job.json``: the default checks,
    and ``--input`` is required)."""
    from pipelines import io

    marker = io.join(output, "_job.json")
    if not io.exists(marker):
        for product_id, values in predictions.values.items():
            category = predictions.categories.get(product_id)
            if category is None:  # a hand-made file without its category: nothing to check it by
                continue
            names = {a.name for a in schema.categories.get(category, ())}
            if category not in schema.categories or not set(values) <= names:
                raise ValueError(f"--attributes does not hold the category {category!r} or its attributes "
                                 f"{sorted(set(values) - names)} of {output}: pass the job's schema")
        if given is None:
            raise ValueError(f"{output} has no _job.json to name its input: pass --input")
        return ValidationConfig(), ReadConfig(given)
    job = io.read_json(marker)
    arguments = job.get("arguments") if isinstance(job, dict) else None
    if not isinstance(arguments, dict):
        raise ValueError(f"{marker} is not an `hpd extract` job record (no arguments)")
    digest = arguments.get("attributes")
    if digest is not None and digest != schema.digest():
        raise ValueError(f"--attributes is not the schema the job in {output} ran with: pass that one")
    validation, read = (arguments.get(k) if isinstance(arguments.get(k), dict) else {} for k in ("validation", "read"))
    uri = given or arguments.get("input")
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{marker} does not name the job's input: pass --input")
    known = lambda config, values: {k: v for k, v in values.items() if k in config.__dataclass_fields__}  # noqa: E731
    read = {k: v for k, v in known(ReadConfig, read).items() if k in ("limit", "shard_bytes", "read_block_bytes")}
    return ValidationConfig(**known(ValidationConfig, validation)), ReadConfig(uri, **read)


def job_records(read: ReadConfig, schema, validation: ValidationConfig, predictions) -> tuple[dict[str, dict], int]:
    """The records of the output's products, as the job took them: in input order, the first
    valid copy of an id settles it, and it is the product only under the category the output
    wrote it in. Stops once every product of the output is settled. Also returns how many were
    settled under another category."""
    from pipelines import reader

    wanted = predictions.values
    records: dict[str, dict] = {}
    settled: set[str] = set()
    other_category = 0
    for shard in reader.plan_input(read).shards:
        for row in reader.iter_records(shard, read):
            record = row.value if row.error is None else None  # the job rejects the others
            product_id = id_of(record.get("product_id")) if isinstance(record, dict) else None
            if product_id not in wanted or product_id in settled:
                continue
            if not isinstance(validate_record(record, schema, validation), Accepted):
                continue
            settled.add(product_id)
            written = predictions.categories.get(product_id)
            if written is not None and record["category"] != written:
                other_category += 1  # the job wrote it under another category: not this input's record
            else:
                records[product_id] = record
            if len(settled) == len(wanted):
                return records, other_category
    return records, other_category


def run(args: argparse.Namespace) -> int:
    from datafiles.predictions import read_predictions

    config = SelectionConfig(args.count, args.min_per_category, args.seed)
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise ValueError(f"--out {args.out} is not a new or empty folder")
    schema = load_schema(args.attributes)
    predictions = read_predictions(args.output)
    validation, read = job_settings(args.output, schema, predictions, args.input)
    records, other_category = job_records(read, schema, validation, predictions)
    missing = len(predictions.values) - len(records)
    if not records:
        raise ValueError(f"no product of {args.output} is in its input {read.uri} as the job read it: "
                         "pass the job's own input (--input)")
    products = [(product_id, record["category"]) for product_id, record in records.items()]
    chosen = select(products, config)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / RECORDS_FILE, "w", encoding="utf-8") as out:
        for product_id in chosen:
            out.write(json.dumps(records[product_id], ensure_ascii=False, default=str) + "\n")
    (args.out / ATTRIBUTES_FILE).write_text(schema_file_text(schema.categories), encoding="utf-8")  # JSON, as named
    categories = dict(products)
    with open(args.out / DRAFT_FILE, "w", encoding="utf-8") as out:
        for product_id in chosen:
            names = [a.name for a in schema.attributes(categories[product_id])]
            line = gold_draft(product_id, categories[product_id], predictions.values[product_id], names)
            out.write(json.dumps(line, ensure_ascii=False) + "\n")

    per_category = Counter(categories[p] for p in chosen)
    if missing:
        print(f"hpd pick: warning: {missing} of the {len(predictions.values)} products of {args.output} are not in "
              f"{read.uri} as the job read it ({other_category} under another category): is it the job's input?",
              file=sys.stderr)
    print(f"hpd pick: {len(chosen)} of {len(products)} products (seed {config.seed}): "
          + ", ".join(f"{c} {n}" for c, n in sorted(per_category.items())), file=sys.stderr)
    if len(chosen) > config.count:
        print(f"  more than --count {config.count}: at least {config.min_per_category} of each of the "
              f"{len(per_category)} categories (--min-per-category)", file=sys.stderr)
    elif len(chosen) < config.count:
        print(f"  fewer than --count {config.count}: the output holds only {len(products)} products of its input: "
              "all of them", file=sys.stderr)
    print(f"  correct {args.out / DRAFT_FILE} (the model's values; n/a: none) and save it as {args.out / 'gold.jsonl'}, "
          f"then: hpd finetune --train {args.out} --init-adapter default --dtype auto --out ADAPTER", file=sys.stderr)
    print(json.dumps({"picked": len(chosen), "of": len(products), "not_in_input": missing, "seed": config.seed,
                      "per_category": dict(sorted(per_category.items())), "out": str(args.out)}))
    return 0
