"""`hpd pick OUTPUT --input RECORDS --attributes FILE --count N --out FOLDER`: a sample of a
catalog's products to label, for `hpd finetune --init-adapter default`.

The choice is ``training.selection`` (a share per category, within it the products first in the
seed's order); this module reads an `hpd extract` output and its input, and writes an `hpd
convert`-style folder: ``records.jsonl`` (the chosen products' records as they were),
``attributes.json``, ``gold-draft.jsonl`` (the model's values, to correct and save as
``gold.jsonl``) and ``labels.csv``, the same values as a sheet to correct in a spreadsheet
(``datafiles.labels``; ``hpd convert labels`` makes ``gold.jsonl`` of it). The input is the job's own (``_job.json`` names it, and its ``--limit``), local or
``s3://``, a file or a prefix, read as the job read it: the records are checked as the job checked
them (the first valid copy of an id is the product), and the schema must be the job's.

Its memory is bounded by the products picked and the categories, not by the output's size:
1. ``census``: the product_id column of each output file, one file at a time: products per category
   (distinct ids per file: `hpd extract` writes a product's rows to one file), hence the quotas;
2. ``sample``: the same column again, keeping per category its quota and ``reserves`` per product
   of it that come first in the seed's order (``training.selection.Lowest``);
3. ``job_records``: the input, for those ids only, until each is settled;
4. each category's quota of them that are in the input, first in the order; their values are read
   from the files that hold them (``datafiles.predictions.read_values``).
A product of no category (a hand-made file with neither a ``category=`` folder nor column) takes
its input record's, found in a first read of the input for such products only. The counts go to
stderr, the last stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE, GOLD_DRAFT_FILE, RECORDS_FILE, gold_draft
from datafiles.labels import SHEET_FILE, gold_text, write_sheet
from datafiles.predictions import attribute_paths, read_values, rows_by_category
from pipelines.compact import reading
from pipelines.reader import ReadConfig
from pipelines.schema import Accepted, ValidationConfig, id_of, load_schema, schema_file_text, validate_record
from training.selection import Lowest, SelectionConfig, quotas, seed_key

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


def job_settings(output: str, schema, given: str | None) -> tuple[ValidationConfig, ReadConfig, bool]:
    """The job's record checks (``--oversize``, ``--max-text-chars``) and its input as it read it
    (``--input`` if given, else the job's; the job's ``--limit``), from its ``_job.json``, whose
    digest of the schema (jobs.config) must be the schema's. Also whether it has a ``_job.json``:
    an output without one gets the default checks, needs ``--input``, and its schema is checked
    by the categories and attributes of its values instead (``check_schema``)."""
    import pyarrow.fs as pafs

    from pipelines import io

    marker = io.join(output, "_job.json")
    if not io.exists(marker):
        fs, values = io.filesystem(io.join(output, "attributes"))
        if fs.get_file_info(values).type != pafs.FileType.Directory:
            raise ValueError(f"{output} is not an `hpd extract` output (no _job.json, no attributes/): give the --output "
                             "of the job whose products to pick")
        if given is None:
            raise ValueError(f"{output} has no _job.json to name its input: pass --input")
        return ValidationConfig(), ReadConfig(given), False
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
    return ValidationConfig(**known(ValidationConfig, validation)), ReadConfig(uri, **read), True


def check_schema(output: str, schema, attributes: Mapping[str, set[str]]) -> None:
    """The schema must hold every category of the output and the attributes of its values there."""
    for category in sorted(attributes):
        names = {a.name for a in schema.categories.get(category, ())}
        if category not in schema.categories or not attributes[category] <= names:
            raise ValueError(f"--attributes does not hold the category {category!r} or its attributes "
                             f"{sorted(attributes[category] - names)} of {output}: pass the job's schema")


@dataclass(frozen=True)
class Census:
    """A first look at an output's product ids."""

    sizes: Counter  # category -> products
    unplaced: frozenset[str]  # products of no category (hand-made files): their input records place them
    attributes: dict[str, set[str]]  # category -> the attributes of its values, when asked for


def census(filesystem, paths: Iterable[str], attributes: bool) -> Census:
    """Products per category of the files ``paths``, counted file by file (distinct ids in each:
    `hpd extract` writes all of a product's rows to one file), and the names of the attributes
    per category if asked. Holds one file's columns at a time, the categories and the products
    of no category."""
    import pyarrow.compute as pc

    sizes: Counter = Counter()
    unplaced: set[str] = set()
    names: dict[str, set[str]] = {}
    columns = ("product_id", "attribute") if attributes else ("product_id",)
    for path in paths:
        for category, table in rows_by_category(filesystem, path, columns).items():
            ids = pc.unique(table["product_id"]).drop_null()
            if category is None:
                unplaced.update(ids.to_pylist())
                continue
            sizes[category] += len(ids)
            if attributes:
                names.setdefault(category, set()).update(pc.unique(table["attribute"]).drop_null().to_pylist())
    return Census(sizes, frozenset(unplaced), names)


def sample(filesystem, paths: Iterable[str], limits: Mapping[str, int], placed: Mapping[str, str],
           key: bytes) -> dict[str, Lowest]:
    """Per category, its ``limits[category]`` products first in the order ``key`` draws, and the
    files they were seen in; ``placed``: the category of each product of no category (``census``)."""
    import pyarrow.compute as pc

    lowest = {category: Lowest(limit, key) for category, limit in limits.items()}
    for path in paths:
        for category, table in rows_by_category(filesystem, path, ("product_id",)).items():
            ids = pc.unique(table["product_id"]).drop_null().to_pylist()
            if category is not None:
                if category in lowest:  # else written since the census (a job at work): not counted, not picked
                    lowest[category].offer(ids, path)
                continue
            for product_id in ids:
                if product_id in placed and placed[product_id] in lowest:
                    lowest[placed[product_id]].offer((product_id,), path)
    return lowest


def job_records(read: ReadConfig, schema, validation: ValidationConfig,
                wanted: Mapping[str, str | None]) -> tuple[dict[str, dict], int]:
    """The records of the products ``wanted`` (product_id -> the category the output wrote it under,
    ``None`` for any), as the job took them: in input order, the first valid copy of an id settles
    it, and it is the product only under the category the output wrote it in. Stops once every
    product wanted is settled. Also returns how many were settled under another category."""
    from pipelines import reader

    records: dict[str, dict] = {}
    settled: set[str] = set()
    other_category = 0
    if not wanted:
        return records, other_category
    for shard in reader.plan_input(read).shards:
        for row in reader.iter_records(shard, read):
            record = row.value if row.error is None else None  # the job rejects the others
            product_id = id_of(record.get("product_id")) if isinstance(record, dict) else None
            if product_id not in wanted or product_id in settled:
                continue
            if not isinstance(validate_record(record, schema, validation), Accepted):
                continue
            settled.add(product_id)
            written = wanted[product_id]
            if written is not None and record["category"] != written:
                other_category += 1  # the job wrote it under another category: not this input's record
            else:
                records[product_id] = record
            if len(settled) == len(wanted):
                return records, other_category
    return records, other_category


def run(args: argparse.Namespace) -> int:
    from pipelines import io

    config = SelectionConfig(args.count, args.min_per_category, args.seed)
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise ValueError(f"--out {args.out} is not a new or empty folder")
    schema = load_schema(args.attributes)
    validation, read, has_job = job_settings(args.output, schema, args.input)
    with reading(args.output):  # not while `hpd compact` moves its files, nor across one
        filesystem, paths = attribute_paths(args.output)
        found = census(filesystem, paths, attributes=not has_job)  # 1: products per category
        if not has_job:
            check_schema(args.output, schema, found.attributes)
        placed = {product_id: record["category"] for product_id, record in
                  job_records(read, schema, validation, dict.fromkeys(found.unplaced))[0].items()}
        sizes = Counter(found.sizes)
        sizes.update(placed.values())  # (a Counter's + would drop a category of no products)
        total = sum(found.sizes.values()) + len(found.unplaced)
        if total == 0:
            raise ValueError(f"{args.output} holds no products: nothing to pick")
        wanted = quotas(sizes, config.count, config.min_per_category, config.seed)
        limits = {category: min(n, wanted[category] * (1 + config.reserves)) for category, n in sizes.items()}
        lowest = sample(filesystem, attribute_paths(args.output)[1], limits, placed, seed_key(config.seed))  # 2
        kept_in: dict[str, list[str]] = {}  # product -> the categories that keep it (more than one: written under each)
        for category, kept in lowest.items():
            for product_id in kept.ranked():
                kept_in.setdefault(product_id, []).append(category)
        # the category the output wrote each under (None: any; its record's category decides where it counts)
        candidates = {product_id: None if product_id in placed or len(cs) > 1 else cs[0] for product_id, cs in kept_in.items()}
        records, other_category = job_records(read, schema, validation, candidates)  # 3: their records, in input order
        looked_up = len(candidates) + len(found.unplaced) - len(placed)
        missing = looked_up - len(records)
        if not records:
            raise ValueError(f"no product of {args.output} is in its input {read.uri} as the job read it: "
                             "pass the job's own input (--input)")
        # 4: per category, its quota of those in the input under that category, first in the order; their values
        picks = {category: [p for p in kept.ranked() if p in records and records[p]["category"] == category][: wanted[category]]
                 for category, kept in lowest.items()}
        picked = {product_id for ps in picks.values() for product_id in ps}
        chosen = [product_id for product_id in records if product_id in picked]  # input order
        holding = sorted({path for category, ps in picks.items() for p in ps for path in lowest[category].seen_in[p]})
        values = read_values(filesystem, holding, chosen)
        if gone := [product_id for product_id in chosen if product_id not in values]:
            raise ValueError(f"the values of {len(gone)} picked product(s) ({gone[0]}, ...) are no longer in {args.output}: "
                             "was the job writing or resuming meanwhile? Pick again once it has finished")
    split = sorted(p for category, kept in lowest.items() for p in kept.ranked() if len(kept.seen_in[p]) > 1)
    twice = sorted(p for p, cs in kept_in.items() if len(cs) > 1)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / RECORDS_FILE, "w", encoding="utf-8") as out:
        for product_id in chosen:
            out.write(json.dumps(records[product_id], ensure_ascii=False, default=str) + "\n")
    (args.out / ATTRIBUTES_FILE).write_text(schema_file_text(schema.categories), encoding="utf-8")  # JSON, as named
    categories = {product_id: records[product_id]["category"] for product_id in chosen}
    drafts = [gold_draft(product_id, categories[product_id], values.get(product_id, {}),
                         [a.name for a in schema.attributes(categories[product_id])]) for product_id in chosen]
    (args.out / DRAFT_FILE).write_text(gold_text(drafts), encoding="utf-8")
    write_sheet(args.out / SHEET_FILE, drafts, {product_id: records[product_id]["title"] for product_id in chosen})

    per_category = Counter(categories.values())
    short = {c: (len(ps), wanted[c]) for c, ps in sorted(picks.items()) if len(ps) < wanted[c]}
    if has_job and not io.exists(io.join(args.output, "_report.json")):
        print(f"hpd pick: warning: {args.output} has no _report.json: its job has not finished, and the picks come "
              "from what it has written so far", file=sys.stderr)
    if split or twice:
        example = (split or twice)[0]
        print(f"hpd pick: warning: products of {args.output} have their rows in more than one file ({len(split)} of "
              f"those looked up, e.g. {example!r}) or under more than one category ({len(twice)}): `hpd extract` "
              "writes neither, so this is a hand-made output, and its counts per category, hence the shares, count "
              "such products more than once", file=sys.stderr)
    if missing:
        sampled = "" if looked_up == total else f"; it looked up only those it may pick and their reserves, of {total}"
        print(f"hpd pick: warning: {missing} of the {looked_up} products of {args.output} are not in {read.uri} as the "
              f"job read it ({other_category} under another category{sampled}): is it the job's input?", file=sys.stderr)
    print(f"hpd pick: {len(chosen)} of {total} products (seed {config.seed}): {by_category(per_category)}",
          file=sys.stderr)
    if len(chosen) > config.count:
        print(f"  more than --count {config.count}: at least {config.min_per_category} of each of the "
              f"{len(per_category)} categories (--min-per-category)", file=sys.stderr)
    if sum(wanted.values()) < config.count:
        print(f"  fewer than --count {config.count}: the output holds only {total - missing} products of its input: "
              "all of them", file=sys.stderr)
    elif short:
        def why(category: str) -> str:
            if limits[category] == sizes[category]:  # every product of the category was looked up
                return "no more of its products are in the input"
            return f"more of its products are not in the input than its reserves ({config.reserves} per product picked)"

        print(f"  {f'fewer than --count {config.count}: ' if len(chosen) < config.count else ''}short of their share: "
              + ", ".join(f"{c} {got} of {share} ({why(c)})" for c, (got, share) in short.items())
              + "; a share follows the output's count of the category, and is not moved to another", file=sys.stderr)
    print(f"  correct the values of {args.out / SHEET_FILE} in a spreadsheet (an empty cell: none) and run hpd convert "
          f"labels {args.out / SHEET_FILE} --out {args.out}, or correct {args.out / DRAFT_FILE} (n/a: none) and save it "
          f"as {args.out / 'gold.jsonl'}; then: hpd finetune --train {args.out} --init-adapter default --dtype auto "
          "--out ADAPTER", file=sys.stderr)
    print(json.dumps({"picked": len(chosen), "of": total, "looked_up": looked_up, "not_in_input": missing,
                      "seed": config.seed, "per_category": dict(sorted(per_category.items())), "out": str(args.out)}))
    return 0


SHOWN_CATEGORIES = 12  # the summary names each category up to this many, then the most and least picked


def by_category(per_category: Counter) -> str:
    """The picks per category in words: every one, or for many categories the most and least picked
    (a catalog of 2,000 categories made a 24 KB line that buried the warnings after it)."""
    if len(per_category) <= SHOWN_CATEGORIES:
        return ", ".join(f"{c} {n}" for c, n in sorted(per_category.items()))
    ranked = sorted(per_category.items(), key=lambda item: (-item[1], item[0]))
    half = SHOWN_CATEGORIES // 2
    return (f"{len(per_category)} categories, the most picked {', '.join(f'{c} {n}' for c, n in ranked[:half])}; the "
            f"least {', '.join(f'{c} {n}' for c, n in ranked[-half:])} (all of them: the JSON line's per_category)")
