"""The benchmark's dataset files, as `hpd convert` writes them, and the attribute schema.

- ``records.jsonl`` (``read_records``): ``{product_id, category, title, description?, features?}``
  per line, the input rows of ``hpd extract``.
- ``attributes.json`` (``read_attributes``): category -> attribute names, in any format the
  extraction job reads (``pipelines.schema``), local or ``s3://``.
- ``gold.jsonl`` (``read_gold``): ``{product_id, category, target_scores}`` per line, the gold of
  ``hpd evaluate`` and of ``hpd finetune``; ``target_scores`` is checked by
  ``validate_target_scores``.

Errors are ``ValueError``s that name the file and the 1-based line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from datafiles.storage import read_jsonl, read_text
from pipelines.schema import id_of

RECORDS_FILE = "records.jsonl"
ATTRIBUTES_FILE = "attributes.json"
GOLD_FILE = "gold.jsonl"
GOLD_DRAFT_FILE = "gold-draft.jsonl"  # `hpd pick`'s: the model's values, to correct and save as gold.jsonl
NULL_GOLD = "n/a"  # a gold value meaning: the product has none


@dataclass(frozen=True)
class GoldExample:
    """One gold product: ``target_scores`` maps attribute -> {acceptable value: 1}; ``line``, its
    1-based line in the gold file (None when not read from one), for messages."""

    product_id: str
    category: str
    target_scores: Mapping[str, Mapping[str, object]]
    line: int | None = field(default=None, compare=False)


def validate_target_scores(target_scores: object, where: str) -> dict[str, dict[str, object]]:
    """Check ``{attribute: {value: score, ...}}`` with non-empty names; return it unchanged."""
    if not isinstance(target_scores, dict):
        raise ValueError(f"{where}: 'target_scores' must be an object, got {type(target_scores).__name__}")
    for attribute, values in target_scores.items():
        if not attribute.strip():
            raise ValueError(f"{where}: empty attribute name in 'target_scores'")
        if not isinstance(values, dict) or not values:
            raise ValueError(
                f"{where}: target_scores[{attribute!r}] must be a non-empty object like {{\"value\": 1}} "
                f"(use {{\"n/a\": 1}} for no value), got {values!r}"
            )
    return target_scores


def _shown(value: object) -> str:
    """What a field holds, for an error: ``missing``, or ``got`` and its value, cut short."""
    return "missing" if value is None else f"got {type(value).__name__} {repr(value)[:50]}"


def read_records(path: str | Path, limit: int | None = None) -> list[dict]:
    """``records.jsonl`` rows (the first ``limit``); errors name the 1-based line. An integer
    ``product_id`` reads as its decimal string, as the job reads it."""
    rows: list[dict] = []
    for number, row in read_jsonl(path):
        if limit is not None and len(rows) >= limit:
            break
        row = {**row, "product_id": id_of(row.get("product_id"))}
        for key in ("product_id", "category", "title"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise ValueError(f"{path} line {number}: '{key}' must be a non-empty string ({_shown(row.get(key))})")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


def read_gold(uri: str) -> list[GoldExample]:
    """gold.jsonl of ``hpd convert``: ``{"product_id", "category", "target_scores"}`` per line."""
    examples: list[GoldExample] = []
    seen: set[str] = set()
    for number, row in read_jsonl(uri):
        where = f"{uri} line {number}"
        row = {**row, "product_id": id_of(row.get("product_id"))}  # an integer id: its decimal string
        for key in ("product_id", "category"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise ValueError(f"{where}: '{key}' must be a non-empty string ({_shown(row.get(key))}; "
                                 "is this a gold.jsonl from hpd convert?)")
        if row["product_id"] in seen:
            raise ValueError(f"{where}: duplicate product_id {row['product_id']!r}")
        seen.add(row["product_id"])
        target_scores = validate_target_scores(row.get("target_scores"), where)
        examples.append(GoldExample(row["product_id"], row["category"], target_scores, number))
    if not examples:
        raise ValueError(f"{uri}: no gold rows")
    return examples


def unknown_attributes(example: GoldExample, known: Iterable[str]) -> list[str]:
    """The attributes ``example`` names that are not among ``known`` (its category's in the schema),
    each with the known name it differs from only in case, if any: ``"brand (Brand?)"``."""
    known = list(known)
    folded = {name.casefold(): name for name in known}
    unknown = [name for name in example.target_scores if name not in known]
    return [f"{name} ({folded[name.casefold()]}?)" if name.casefold() in folded else name for name in unknown]


def gold_draft(product_id: str, category: str, values: Mapping[str, object], attributes: list[str]) -> dict:
    """A gold line (``read_gold``'s format) holding a model's values, for a person to correct: each
    attribute of the category, its value or ``n/a`` for none (`hpd pick`)."""
    target_scores = {name: {NULL_GOLD if values.get(name) is None else str(values[name]): 1} for name in attributes}
    return {"product_id": product_id, "category": category, "target_scores": target_scores}


def read_attributes(uri: str) -> dict[str, list[str]]:
    """category -> attribute names, from an attribute schema file (local or s3://) in the formats
    the extraction job reads (``pipelines.schema``)."""
    from pipelines.schema import schema_from_text

    schema = schema_from_text(read_text(uri), uri)
    return {category: [a.name for a in attributes] for category, attributes in schema.categories.items()}
