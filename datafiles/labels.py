"""The labelling sheet: a catalog sample's values as a spreadsheet (``labels.csv``) and back as gold.

``hpd pick`` writes the sheet beside ``gold-draft.jsonl``, with the same values: one row per
product and attribute, in the draft's order, with the columns ``product_id``, ``category``,
``title`` (for the person labelling; not read back), ``attribute`` and ``value`` (the model's
value; empty: none). A person corrects the ``value`` cells in any spreadsheet, one value per cell
(an empty cell: the product has none), and ``hpd convert labels`` turns the sheet into
``gold.jsonl`` (``read_sheet``), checked against the sample's ``records.jsonl`` and
``attributes.json``:

- errors, naming the sheet's row: a missing column, a product id not in the records, a category
  other than the record's, an attribute not in the category's schema (with the nearest name), a
  (product, attribute) given twice;
- warnings, counted: a value found in none of the product's text fields (`hpd extract` writes only
  values found there, so the model is taught a value it will not write), a product of the records
  with no row (left out of the gold), attributes of a product with no row (left out of its gold:
  skipped by the ExtractGPT metric, trained as none).

The file is UTF-8 with a byte-order mark, which spreadsheet programs need to read it as UTF-8;
reading takes it with or without one. Cells are written as they are: a spreadsheet program may
read a title or value beginning with ``=``, ``+``, ``-`` or ``@`` as a formula, and an id such as
``00123`` as a number, so open the sheet with its columns as text (an id it changed is refused on
the way back; a value it changed is warned of, being in none of the product's texts). Gold lines are written as ``hpd pick`` writes its draft
(``datafiles.dataset.gold_draft``), products in the sheet's order and attributes in the schema's,
so a sheet saved unchanged gives the draft byte for byte (and ``hpd finetune`` warns of it as of
an uncorrected draft).
"""

from __future__ import annotations

import csv
import difflib
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from datafiles.dataset import NULL_GOLD, gold_draft

SHEET_FILE = "labels.csv"
COLUMNS = ("product_id", "category", "title", "attribute", "value")
READ_COLUMNS = ("product_id", "category", "attribute", "value")  # title is for the person, not read back
ENCODING = "utf-8-sig"  # a byte-order mark: spreadsheet programs read the file as UTF-8
EXAMPLES = 3  # examples named in a warning


def sheet_rows(drafts: Iterable[Mapping], titles: Mapping[str, str]) -> Iterable[list[str]]:
    """The sheet's rows (header first) for gold lines (``gold_draft``'s format), one per product and
    attribute; a gold null (``n/a``) is an empty cell."""
    yield list(COLUMNS)
    for line in drafts:
        for attribute, values in line["target_scores"].items():
            value = next(iter(values))
            yield [line["product_id"], line["category"], titles.get(line["product_id"], ""), attribute,
                   "" if value == NULL_GOLD else value]


def write_sheet(path: Path, drafts: Iterable[Mapping], titles: Mapping[str, str]) -> None:
    with open(path, "w", encoding=ENCODING, newline="") as out:
        csv.writer(out).writerows(sheet_rows(drafts, titles))


@dataclass(frozen=True)
class Sheet:
    """A sheet read back: ``gold`` lines in the sheet's product order, and what to warn of."""

    gold: list[dict]
    warnings: tuple[str, ...]


def _texts(record: Mapping) -> list[str]:
    """The product's text fields as `hpd extract`'s text check reads them (hpd_core.spans.in_text)."""
    features = record.get("features") or []
    return [t for t in (record.get("title"), record.get("description"), *features) if isinstance(t, str) and t]


def _examples(items: list[str]) -> str:
    return ", ".join(items[:EXAMPLES]) + (f" and {len(items) - EXAMPLES} more" if len(items) > EXAMPLES else "")


def read_sheet(text: str, where: str, records: Mapping[str, Mapping], schema: Mapping[str, list[str]]) -> Sheet:
    """Gold lines from a sheet's ``text`` (``where`` names it in messages), checked against the
    sample's ``records`` (product_id -> record) and ``schema`` (category -> attribute names);
    ``ValueError`` for the errors of the module doc, the warnings counted in ``Sheet.warnings``."""
    reader = csv.DictReader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    header = reader.fieldnames or []
    if missing := [c for c in READ_COLUMNS if c not in header]:
        raise ValueError(f"{where}: no column {', '.join(repr(c) for c in missing)} (the columns are "
                         f"{', '.join(repr(c) for c in header) or 'none'}; expected {', '.join(COLUMNS)}, as hpd pick "
                         "writes them: keep the header row)")
    values: dict[str, dict[str, str]] = {}  # product -> attribute -> value, in the sheet's order
    not_in_text: list[str] = []
    for number, row in enumerate(reader, start=2):  # the header is row 1
        at = f"{where} row {number}"
        if all(not (row.get(c) or "").strip() for c in READ_COLUMNS):
            continue  # an empty row, as spreadsheets leave at the end
        if None in row:
            raise ValueError(f"{at}: more cells than columns (a value holding a comma must be quoted: save the sheet "
                             "as CSV from the spreadsheet program rather than editing it as text)")
        product_id, category, attribute = (row[c] or "" for c in ("product_id", "category", "attribute"))
        value = (row["value"] or "").strip()
        record = records.get(product_id)
        if record is None:
            raise ValueError(f"{at}: product_id {product_id!r} is not in the sample's records (a sheet of another "
                             "sample, or an id the spreadsheet changed: format the product_id column as text)")
        if category != record["category"]:
            raise ValueError(f"{at}: product {product_id!r} has category {category!r} here and {record['category']!r} "
                             "in the records: the category is not to be edited")
        names = schema.get(category, [])
        if attribute not in names:
            near = difflib.get_close_matches(attribute, names, n=1, cutoff=0.8)
            raise ValueError(f"{at}: attribute {attribute!r} is not one of category {category!r}'s"
                             + (f" (did you mean {near[0]!r}?)" if near else f": {', '.join(names)}"))
        held = values.setdefault(product_id, {})
        if attribute in held:
            raise ValueError(f"{at}: product {product_id!r}, attribute {attribute!r} is given a second time")
        held[attribute] = value
        if value and not any(value in text for text in _texts(record)):
            not_in_text.append(f"{product_id} {attribute}: {value!r} (row {number})")

    gold, partial = [], []
    for product_id, held in values.items():
        names = schema[records[product_id]["category"]]
        if left := [name for name in names if name not in held]:
            partial.append(f"{product_id} ({', '.join(left)})")
        given = {name: held[name] or None for name in names if name in held}
        gold.append(gold_draft(product_id, records[product_id]["category"], given, [n for n in names if n in held]))
    warnings = []
    if not_in_text:
        warnings.append(f"{len(not_in_text)} value(s) are in none of their product's text fields: {_examples(not_in_text)}; "
                        "`hpd extract` writes only values found in the text, so these teach the model values it will "
                        "not write (correct the spelling to the text's, or leave the cell empty if the product has none)")
    if unlabelled := [product_id for product_id in records if product_id not in values]:
        warnings.append(f"{len(unlabelled)} product(s) of the records have no row in the sheet and are left out of the "
                        f"gold: {_examples(unlabelled)}")
    if partial:
        warnings.append(f"{len(partial)} product(s) lack rows for some attributes, left out of their gold (skipped by "
                        f"the ExtractGPT metric, trained as none): {_examples(partial)}")
    return Sheet(gold, tuple(warnings))


def gold_text(gold: Iterable[Mapping]) -> str:
    """Gold lines as ``gold.jsonl``'s text, written as ``hpd pick`` writes its draft."""
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in gold)
