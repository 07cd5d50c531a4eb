"""Training data for `hpd finetune`: product records joined with target values.

Two sources of target values, always joined to a records file by ``product_id``:

- gold (``hpd convert extractgpt`` output): ``gold.jsonl`` rows ``{product_id, category,
  target_scores: {attribute: {value: 1, ...}}}``. The target of an attribute is the first key of
  ``target_scores[attribute]`` (stripped), or the first that occurs in the product's text where
  the first does not; ``"n/a"`` and attributes absent from ``target_scores`` (OA-Mine leaves them
  out) are null. Targets that are not in their product's text are counted (extraction writes
  such a value as null).
- a teacher (distillation): the output directory of another ``hpd extract`` run, whose
  ``attributes/category=<escaped>/`` holds Parquet rows ``{product_id, attribute, value, truncated,
  ...}`` (categories come from the records). Products the teacher did not answer are skipped; so are products with any
  truncated teacher value (a cut value is not a target). A schema attribute with no teacher row
  counts as null and is reported. With a confidence floor (``--min-confidence``, an output of
  ``hpd extract --confidence``) a value below it is kept as its slot's value but is no target
  (``Labeled.scored``). Of the output only the records' products are held (``read_predictions(uri,
  only=...)``, a file at a time): it may be a whole catalog's run, the records a sample of it.

Records are validated exactly as the extraction job validates them (``pipelines.schema``), so a
training prompt holds the same product text and attribute list as an extraction prompt. Rejected
records and records without targets are skipped and counted in ``TrainingData.stats``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE, GOLD_DRAFT_FILE, GOLD_FILE, NULL_GOLD, RECORDS_FILE, read_gold, unknown_attributes
from datafiles.predictions import read_predictions, stored_threshold
from datafiles.storage import read_json_lines
from hpd_core.collate import Labeled
from hpd_core.spans import in_text
from hpd_core.types import Attribute, Product
from pipelines.reader import PARQUET_SUFFIXES
from pipelines.schema import Accepted, ValidationConfig, load_schema, record_id, validate_record


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingData:
    """Labelled products (input order) and the attributes of each category (prompt order)."""

    products: list[Labeled]
    attributes: dict[str, tuple[Attribute, ...]]
    stats: dict[str, int | dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Sources:
    records: Path
    attributes: Path
    gold: Path


def resolve_sources(train: Path, attributes: Path | None = None, gold: Path | None = None) -> Sources:
    """``--train`` is an ``hpd convert`` directory or a records file; the schema and gold default
    to ``attributes.json`` and ``gold.jsonl`` beside the records."""
    if train.is_dir():
        records, folder = train / RECORDS_FILE, train
    else:
        records, folder = train, train.parent
    sources = Sources(records, attributes or folder / ATTRIBUTES_FILE, gold or folder / GOLD_FILE)
    if not sources.records.is_file():
        raise ValueError(f"records file {sources.records} not found: --train takes a folder holding {RECORDS_FILE} "
                         f"(with {ATTRIBUTES_FILE} and {GOLD_FILE}, as `hpd convert` writes them) or a records file")
    if not sources.attributes.is_file():
        raise ValueError(f"attribute schema {sources.attributes} not found: pass --attributes FILE, or put "
                         f"{ATTRIBUTES_FILE} beside the records")
    return sources


def read_records(path: Path) -> list[object]:
    """Records from JSONL (one object per line) or Parquet (.parquet, .pq)."""
    if path.suffix.lower() in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = [row for _, row in read_json_lines(path)]  # non-objects become rejected records
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


def accepted_records(path: Path, schema) -> tuple[list[Accepted], dict, set[str]]:
    """Validate records as the extraction job does; duplicates of a product_id are skipped. Also
    returns the ids of all records, rejected ones too (to tell a gold line without a record from
    one whose record was rejected)."""
    rejected: Counter[str] = Counter()
    accepted: list[Accepted] = []
    seen: set[str] = set()
    records = read_records(path)
    ids = {record_id(r) for r in records} - {None}
    for record in records:
        result = validate_record(record, schema, ValidationConfig())
        if not isinstance(result, Accepted):
            rejected[result.reason] += 1
        elif result.product.product_id in seen:
            rejected["duplicate product_id"] += 1
        else:
            seen.add(result.product.product_id)
            accepted.append(result)
    if cut := sum(result.input_truncated for result in accepted):  # said, not counted: the stats are a run's identity
        log.warning("%d record(s) of %s had their text cut to %d characters, as `hpd extract` cuts it (--oversize "
                    "truncate): the model is trained on what it will be given", cut, path, ValidationConfig().max_text_chars)
    return accepted, {"records": len(records), "rejected": dict(rejected)}, ids


def gold_value(target_scores: dict, attribute: str, product: Product | None = None) -> str | None:
    """First key of ``target_scores[attribute]`` (stripped); None for "n/a" or an absent attribute.
    With ``product``, the first acceptable value that occurs in the product's text, where the first
    does not and another does (extraction writes only values of the text)."""
    values = target_scores.get(attribute)
    if not values:
        return None
    keys = [key.strip() for key in values]
    first = keys[0]
    if first == NULL_GOLD or not first:
        return None
    if product is not None and not in_text(first, product):
        return next((key for key in keys[1:] if key and key != NULL_GOLD and in_text(key, product)), first)
    return first


def target_values(products: list[Labeled]) -> Iterator[tuple[Labeled, str | None]]:
    """Each product's values the run learns: all of them, or with a teacher's floor the scored ones
    (the others are fed, not learned: ``Labeled.scored``)."""
    for product in products:
        for value, scored in zip(product.values, product.scored or (True,) * len(product.values)):
            if scored:
                yield product, value


def count_not_in_text(products: list[Labeled], stats: dict) -> None:
    """Count the target values that are not in their product's text into ``stats`` (only when
    there are any, so the data of earlier runs reads the same), with the first as an example:
    extraction writes such a value as null, and span decoding cannot write it."""
    missing = [(p, value) for p, value in target_values(products) if value is not None and not in_text(value, p.product)]
    if missing:
        product, value = missing[0]
        stats["targets_not_in_text"] = len(missing)
        stats["target_not_in_text_example"] = f"{value!r} for {product.product.product_id}"


def digest(data: TrainingData) -> str:
    """SHA-256 of what the run learns from: each product's category, text and target values (in
    order) and the schema's attributes with their descriptions. `hpd finetune --resume` compares it
    with the first sitting's, so that changed gold values (same counts) are not trained on silently."""
    content = {
        "products": [[p.category, asdict(p.product), list(p.values)] + ([] if p.scored is None else [list(p.scored)])
                     for p in data.products],
        "attributes": {c: [[a.name, a.description] for a in attrs] for c, attrs in data.attributes.items()},
    }
    return hashlib.sha256(json.dumps(content, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


NONE_WORDS = ("n/a", "null", "none")  # any case: meant as none, but only "n/a" is none (NULL_GOLD)


def count_none_words(products: list[Labeled], stats: dict) -> None:
    """Count target values that are a word for none other than ``n/a`` itself (``N/A``, ``null``,
    ``None``): they are trained as those words. Into ``stats`` only when there are any."""
    words = Counter(v for _, v in target_values(products) if v is not None and v.casefold() in NONE_WORDS)
    if words:
        stats["none_words"] = sum(words.values())
        stats["none_words_written"] = ", ".join(f"{word!r} {n}" for word, n in words.most_common())


def _finish(products: list[Labeled], schema, stats: dict) -> TrainingData:
    if not products:
        raise ValueError(f"no training products left after joining records and targets: {stats}")
    stats["products"] = len(products)
    stats["slots"] = sum(len(p.values) for p in products)
    targets = [v for _, v in target_values(products)]
    if any(p.scored is not None for p in products):  # a teacher's floor: the values fed but not learned are no targets
        stats["targets"] = len(targets)
    stats["null_targets"] = sum(v is None for v in targets)
    count_not_in_text(products, stats)
    count_none_words(products, stats)
    return TrainingData(products, dict(schema.categories), stats)


def load_gold(sources: Sources) -> TrainingData:
    """Records joined with ``gold.jsonl`` (see module doc)."""
    if not sources.gold.is_file():
        draft = sources.gold.with_name(GOLD_DRAFT_FILE)
        if draft.is_file():
            raise ValueError(f"gold file {sources.gold} not found, only `hpd pick`'s draft {draft}: correct the draft "
                             f"(the model's values; n/a where the product has none) and save it as {sources.gold}")
        raise ValueError(f"gold file {sources.gold} not found: pass --gold, or --teacher for distillation")
    schema = load_schema(str(sources.attributes))
    accepted, stats, ids = accepted_records(sources.records, schema)
    gold = {ex.product_id: ex for ex in read_gold(str(sources.gold))}
    if strays := [product_id for product_id in gold if product_id not in ids]:  # their labels are lost: counted
        stats["gold_not_in_records"] = len(strays)
        stats["gold_not_in_records_example"] = f"{strays[0]!r} (a record's id: {min(ids)!r})" if ids else repr(strays[0])
    products = []
    unknown: list[str] = []  # a line's attributes the schema does not have for its product's category
    other_category: list[str] = []
    for item in accepted:
        example = gold.get(item.product.product_id)
        if example is None:
            stats["no_targets"] = stats.get("no_targets", 0) + 1
            continue
        names = [a.name for a in schema.attributes(item.category)]
        if example.category != item.category:
            other_category.append(f"{example.product_id!r}: {example.category!r} in the gold, {item.category!r} in the records")
        if strangers := unknown_attributes(example, names):
            unknown.append(f"line {example.line}: {', '.join(strangers)} (category {item.category!r}: {', '.join(names)})")
        values = tuple(gold_value(example.target_scores, name, item.product) for name in names)
        products.append(Labeled(item.category, item.product, values))
    if unknown:  # trained as none for every product: refuse
        more = f" (and {len(unknown) - 1} more line(s))" if len(unknown) > 1 else ""
        raise ValueError(f"{sources.gold} {unknown[0]}{more}: attribute names not in the schema {sources.attributes} "
                         "for the product's category, which would train each of the schema's attributes as none; "
                         "write the schema's names exactly (case too)")
    if other_category:  # trained with the records' category (as extraction prompts it): counted, warned of
        stats["gold_category_differs"] = len(other_category)
        stats["gold_category_differs_example"] = other_category[0]
    return _finish(products, schema, stats)


def uncorrected_draft(sources: Sources) -> Path | None:
    """The ``hpd pick`` draft beside the gold file when the gold is that draft byte for byte (the
    model's own values, not corrected): training on it teaches the model what it already says."""
    draft = sources.gold.with_name(GOLD_DRAFT_FILE)
    if draft.is_file() and sources.gold.is_file() and draft.read_bytes() == sources.gold.read_bytes():
        return draft
    return None


def load_teacher(sources: Sources, teacher: str, min_confidence: float | None = None) -> TrainingData:
    """Records joined with a teacher's ``hpd extract`` output (see module doc). With
    ``min_confidence``, a value the teacher gave a lower confidence (or none: the text check's nulls
    and parse errors' nulls) is fed but is not a target (``Labeled.scored``): training on a catalog's own confident values
    without labelling it."""
    schema = load_schema(str(sources.attributes))
    accepted, stats, _ = accepted_records(sources.records, schema)
    # of the teacher output only the records' products are held: it may be a whole catalog's run
    teacher_output = read_predictions(teacher, only={item.product.product_id for item in accepted})
    predicted, truncated, confidence = teacher_output.values, teacher_output.truncated_products, teacher_output.confidence
    stats["teacher_rows"] = teacher_output.rows
    if min_confidence is not None and not confidence:
        raise ValueError(f"--min-confidence {min_confidence}: the teacher output {teacher} has no confidence for these "
                         "records' values (no confidence column); extract it with `hpd extract --confidence`")
    at_least = None if min_confidence is None else stored_threshold(min_confidence)
    skipped: Counter[str] = Counter()
    missing_values = unscored = 0
    products = []
    for item in accepted:
        product_id = item.product.product_id
        answer = predicted.get(product_id)
        if answer is None:
            skipped["no teacher values"] += 1
            continue
        if product_id in truncated:
            skipped["teacher value truncated"] += 1
            continue
        names = [a.name for a in schema.attributes(item.category)]
        missing_values += sum(name not in answer for name in names)
        values = tuple(None if answer.get(name) is None else str(answer[name]) for name in names)
        scored = None
        if min_confidence is not None:
            sure = confidence.get(product_id, {})
            scored = tuple(name in sure and sure[name] >= at_least for name in names)
            unscored += scored.count(False)
        products.append(Labeled(item.category, item.product, values, scored))
    stats.update(skipped=dict(skipped), teacher_missing_values=missing_values)
    if min_confidence is not None:
        stats["teacher_values_below_confidence"] = unscored
        if products and not any(any(p.scored) for p in products):
            raise ValueError(f"--min-confidence {min_confidence}: none of the teacher's {unscored} values in {teacher} for "
                             "these records has that confidence, so there is nothing to train on; lower it")
    return _finish(products, schema, stats)
