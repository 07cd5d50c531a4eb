"""Benchmark JSONL -> records, attribute schema, gold (what `hpd convert extractgpt` writes).

Input: ExtractGPT's processed format, one JSON object per line:
``{"input": title, "category": str, "target_scores": {attribute: {value: 1, ...}}}``.
Output in DIR:

- ``records.jsonl``   ``{"product_id", "category", "title"}`` (input rows of ``hpd extract``)
- ``attributes.json`` ``{category: [attribute, ...]}``, attributes in first-seen order
- ``gold.jsonl``      ``{"product_id", "category", "target_scores"}`` (gold of ``hpd evaluate``)

Product ids are ``{dataset}-{split}-{line:05d}`` with the 0-based line index in the file (blank
lines are skipped but keep their index), so ids are stable. ``dataset`` defaults to the parent
folder name and ``split`` to the file stem (``data/oa-mine/test.jsonl`` -> ``oa-mine-test-00000``).

Attribute names are stripped of surrounding whitespace (``"Brand "`` is ``"Brand"``). Two names of
one product that are the same once stripped are kept as one when their values are the same, and
are an error naming the product when they differ (which of them is meant is for the file's owner
to say); each stripped name and each merge is counted in ``Converted.warnings``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE, GOLD_FILE, RECORDS_FILE, validate_target_scores
from datafiles.storage import read_jsonl

FORMATS = ("extractgpt",)


@dataclass(frozen=True)
class ConvertConfig:
    """What to convert and where to write it."""

    source: Path
    out_dir: Path
    dataset: str
    split: str
    per_category: int | None = None  # keep only the first N products of each category (same ids)

    def __post_init__(self) -> None:
        for name in ("dataset", "split"):
            value = getattr(self, name)
            if not value or any(ch.isspace() for ch in value):
                raise ValueError(f"{name} must be a non-empty name without whitespace, got {value!r} (set --{name})")
        if self.per_category is not None and self.per_category < 1:
            raise ValueError(f"per_category must be >= 1, got {self.per_category}")


@dataclass(frozen=True)
class Converted:
    """The three outputs, in file order."""

    records: list[dict]
    attributes: dict[str, list[str]]
    gold: list[dict]
    warnings: tuple[str, ...] = ()  # for the user: names stripped, duplicates merged


def default_names(source: Path) -> tuple[str, str]:
    """(dataset, split) from the path: parent folder name and file stem."""
    return source.resolve().parent.name, source.stem


def strip_names(target_scores: dict[str, dict], where: str) -> tuple[dict[str, dict], list[str]]:
    """``target_scores`` with each attribute name stripped, and the names it merged (a name and
    one of the same once stripped, with equal values). Names that collide with different values
    raise a ValueError starting with ``where``: neither value may be silently dropped."""
    stripped: dict[str, dict] = {}
    original: dict[str, str] = {}  # stripped name -> the name it was first given as
    merged: list[str] = []
    for name, values in target_scores.items():
        key = name.strip()
        if key not in stripped:
            stripped[key], original[key] = values, name
        elif stripped[key] == values:
            merged.append(f"{original[key]!r} and {name!r}")
        else:
            raise ValueError(
                f"{where}: attribute names {original[key]!r} and {name!r} are the same name {key!r} once stripped "
                f"of surrounding whitespace, with different values ({stripped[key]!r} and {values!r}); "
                "keep one of them in the file (or merge their values into one)"
            )
    return stripped, merged


def read_extractgpt(source: Path, dataset: str, split: str) -> Converted:
    """Parse and validate an ExtractGPT JSONL file; errors name the 1-based line."""
    records: list[dict] = []
    gold: list[dict] = []
    attributes: dict[str, list[str]] = {}
    renamed = 0  # attribute names with surrounding whitespace
    merges: list[str] = []  # "product: 'Brand' and 'Brand '"
    for number, row in read_jsonl(source):
        where = f"{source} line {number}"
        for key in ("input", "category"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise ValueError(f"{where}: '{key}' must be a non-empty string, got {row.get(key)!r}")
        if "target_scores" not in row:
            raise ValueError(f"{where}: missing 'target_scores'")
        target_scores = validate_target_scores(row["target_scores"], where)
        try:  # a lone surrogate (a "\ud800" escape) reads as JSON but cannot be written as UTF-8
            json.dumps([row["input"], row["category"], target_scores], ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"{where}: not valid Unicode ({err.reason}: {err.object[err.start:err.end]!r})") from err
        product_id = f"{dataset}-{split}-{number - 1:05d}"
        renamed += sum(name != name.strip() for name in target_scores)
        target_scores, merged = strip_names(target_scores, f"{where} (product {product_id})")
        merges.extend(f"{product_id}: {pair}" for pair in merged)
        category = row["category"]
        records.append({"product_id": product_id, "category": category, "title": row["input"]})
        gold.append({"product_id": product_id, "category": category, "target_scores": target_scores})
        names = attributes.setdefault(category, [])
        names.extend(name for name in target_scores if name not in names)
    if not records:
        raise ValueError(f"{source}: no records found")
    warnings = []
    if renamed:
        warnings.append(f"{renamed} attribute name(s) had surrounding whitespace, stripped (\"Brand \" is \"Brand\")")
    if merges:
        warnings.append(f"{len(merges)} attribute name(s) were the same as another of their product once stripped, "
                        f"with the same values, and were kept once: {'; '.join(merges[:3])}{'; ...' if len(merges) > 3 else ''}")
    return Converted(records, attributes, gold, tuple(warnings))


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_converted(converted: Converted, out_dir: Path) -> None:
    """Write records.jsonl, attributes.json and gold.jsonl into ``out_dir`` (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out_dir / RECORDS_FILE, converted.records)
    _write_jsonl(out_dir / GOLD_FILE, converted.gold)
    (out_dir / ATTRIBUTES_FILE).write_text(json.dumps(converted.attributes, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def first_per_category(converted: Converted, n: int) -> Converted:
    """The first ``n`` products of each category (file order), ids and attribute lists unchanged."""
    seen: dict[str, int] = {}
    keep = set()
    for record in converted.records:
        category = record["category"]
        if seen.get(category, 0) < n:
            seen[category] = seen.get(category, 0) + 1
            keep.add(record["product_id"])
    return Converted(
        [r for r in converted.records if r["product_id"] in keep],
        converted.attributes,
        [g for g in converted.gold if g["product_id"] in keep],
        converted.warnings,
    )


def convert(config: ConvertConfig) -> Converted:
    """Read ``config.source`` and write the three files; return what was written."""
    converted = read_extractgpt(config.source, config.dataset, config.split)
    if config.per_category is not None:
        converted = first_per_category(converted, config.per_category)
    write_converted(converted, config.out_dir)
    return converted
