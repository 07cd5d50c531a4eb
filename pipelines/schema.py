"""The attribute schema (category -> attributes) and the rules every input record must pass.

A record that breaks a rule becomes a rejected row with a reason; nothing here raises for a bad
record. A bad *schema* file is a user error and raises ``ValueError`` once, at job start.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpd_core.types import Attribute, Product
from pipelines import jsontext
from pipelines.jsontext import given_twice

OVERSIZE_POLICIES = ("truncate", "reject")
PARTITION_COLUMN = "category"
MAX_PATH_COMPONENT_BYTES = 255  # file-system limit on one directory name (ext4, S3 tools)


@dataclass(frozen=True)
class ValidationConfig:
    """Limits on one record.

    max_text_chars: title + description + features together, in characters. A longer record is
        cut to fit (title first, then description, then features in order) and flagged, or
        rejected, as ``oversize`` says.
    max_id_chars: longest accepted product_id.
    """

    max_text_chars: int = 20_000
    oversize: str = "truncate"
    max_id_chars: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.max_text_chars, int) or self.max_text_chars < 1:
            raise ValueError(f"max_text_chars must be a positive int, got {self.max_text_chars!r}")
        if self.oversize not in OVERSIZE_POLICIES:
            raise ValueError(f"oversize must be one of {OVERSIZE_POLICIES}, got {self.oversize!r}")
        if not isinstance(self.max_id_chars, int) or self.max_id_chars < 1:
            raise ValueError(f"max_id_chars must be a positive int, got {self.max_id_chars!r}")


def partition_value(category: str) -> str:
    """Path-safe directory value for a category: percent-encoded, no ``/``, never ``.`` or ``..``.

    It is the URI encoding Hive-partitioned readers (pyarrow, Ray, Spark) decode back to the
    original category.
    """
    return urllib.parse.quote(category, safe="").replace(".", "%2E")


NEAR_CACHED = 4096  # unknown categories whose nearest known one is kept


@dataclass(frozen=True)
class AttributeSchema:
    """category -> the attributes to extract for it (in prompt order)."""

    categories: dict[str, tuple[Attribute, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.categories:
            raise ValueError("attribute schema is empty: give at least one category")
        for category, attributes in self.categories.items():
            if not isinstance(category, str) or not category.strip():
                raise ValueError(f"category names must be non-empty strings, got {category!r}")
            if category != category.strip():  # records name it exactly: "Tea" would be an unknown category
                raise ValueError(f"category {category!r} begins or ends with white space: remove it")
            _check_unicode(category, "category name")
            name = f"{PARTITION_COLUMN}={partition_value(category)}"
            if len(name.encode()) > MAX_PATH_COMPONENT_BYTES:
                raise ValueError(f"category {category[:40]!r}... is too long for a partition directory ({name[:12]}... "
                                 f"is {len(name.encode())} bytes, escaped, the most is {MAX_PATH_COMPONENT_BYTES}): "
                                 "shorten it")
            if not attributes:
                raise ValueError(f"category {category!r} has no attributes")
            names = [a.name for a in attributes]
            for attribute in attributes:
                _check_unicode(attribute.name, f"category {category!r}: attribute name")
                if attribute.name != attribute.name.strip():  # prompted and written so, never matched by gold
                    raise ValueError(f"category {category!r}: attribute name {attribute.name!r} begins or ends with "
                                     "white space: remove it")
                _check_unicode(attribute.description or "", f"category {category!r}: the description of {attribute.name!r},")
            if len(set(names)) != len(names):
                raise ValueError(f"category {category!r}: attribute names given more than once: {given_twice(names)}")

    def attributes(self, category: str) -> tuple[Attribute, ...]:
        return self.categories[category]

    @functools.cached_property
    def _folded(self) -> dict[str, str]:
        return {c.casefold(): c for c in self.categories}

    @functools.cached_property
    def _near(self) -> dict[str, str | None]:
        return {}  # ``near``'s answers: a catalog names its few unknown categories again and again

    def near(self, category: str) -> str | None:
        """The schema's category that ``category`` names in another case or with white space around
        it, or else the one it is closest to as a string ("Laptops" for "Laptop"), if any is close
        (a hint for a record's unknown category)."""
        folded = category.strip().casefold()
        if folded in self._folded:
            return self._folded[folded]
        if folded not in self._near:
            if len(self._near) >= NEAR_CACHED:
                self._near.clear()
            close = difflib.get_close_matches(folded, list(self._folded), n=1, cutoff=0.8)
            self._near[folded] = self._folded[close[0]] if close else None
        return self._near[folded]

    def to_json(self) -> str:
        """Canonical text (for the run id): same schema, same text."""
        return json.dumps(
            {c: [[a.name, a.description] for a in attrs] for c, attrs in sorted(self.categories.items())},
            sort_keys=True,
        )

    def digest(self) -> str:
        """SHA-256 of ``to_json``: what a job's ``_job.json`` keeps of its schema (and `hpd pick` checks)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def schema_file_text(categories: Mapping[str, tuple[Attribute, ...]]) -> str:
    """A schema as the JSON file ``load_schema`` reads back to the same schema (categories,
    attributes in order, descriptions): ``{category: {attribute: description or null}}``. What a
    command writes as ``attributes.json``, whatever format (JSON or YAML) it was given."""
    data = {category: {a.name: a.description for a in attrs} for category, attrs in categories.items()}
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def _check_unicode(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} {text[:40]!r} is not valid Unicode: {err.reason}") from err


def parse_schema(data: object, source: str = "attribute schema") -> AttributeSchema:
    """Build a schema from ``{category: [name, ...]}`` or ``{category: {name: description}}``."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping category -> attributes, got {type(data).__name__}")
    categories: dict[str, tuple[Attribute, ...]] = {}
    for category, spec in data.items():
        if isinstance(spec, dict):
            items = list(spec.items())
        elif isinstance(spec, list):
            items = [(name, None) for name in spec]
        else:
            raise ValueError(f"{source}: category {category!r} must map to a list or a mapping, got {spec!r}")
        try:
            categories[category] = tuple(Attribute(name, description) for name, description in items)
        except ValueError as err:
            raise ValueError(f"{source}: category {category!r}: {err}") from err
    try:
        return AttributeSchema(categories)
    except ValueError as err:  # which file: the checks above name it, and so do these
        raise ValueError(f"{source}: {err}") from err


def load_schema(path: str) -> AttributeSchema:
    """Read a JSON or YAML attribute schema file (by extension; .json is JSON, anything else YAML)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"attribute schema {path!r} does not exist or is not a file")
    try:
        text = file.read_text(encoding="utf-8-sig")  # a leading byte-order mark is dropped
    except UnicodeDecodeError as err:
        raise ValueError(f"attribute schema {path!r} is not UTF-8 text: {err}") from err
    return schema_from_text(text, path)


def schema_from_text(text: str, source: str) -> AttributeSchema:
    """Parse a schema file's text; ``source`` (its path or URI) picks JSON (``.json``) or YAML."""
    if source.lower().endswith(".json"):
        try:
            data = jsontext.loads(text)
        except ValueError as err:  # json.JSONDecodeError too
            raise ValueError(f"attribute schema {source!r} is not valid JSON: {err}") from err
    else:
        import yaml

        class UniqueKeyLoader(yaml.SafeLoader):  # PyYAML keeps the last of a key given twice
            def construct_mapping(self, node, deep=False):
                if twice := given_twice([self.construct_object(key, deep=deep) for key, _ in node.value]):
                    raise yaml.constructor.ConstructorError(None, None, f"a key given more than once: {twice}", node.start_mark)
                return super().construct_mapping(node, deep=deep)

        try:
            data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as err:
            raise ValueError(f"attribute schema {source!r} is not valid YAML: {err}") from err
    return parse_schema(data, source=source)


@dataclass(frozen=True)
class Accepted:
    """A record that passed: the engine product, its category, and whether its text was cut."""

    product: Product
    category: str
    input_truncated: bool


@dataclass(frozen=True)
class Rejected:
    reason: str


def _is_valid_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _string_field(record: dict, key: str, required: bool) -> str | None | Rejected:
    value = record.get(key)
    if value is None:
        if not required:
            return None
        other = next((k for k in record if isinstance(k, str) and k != key and k.strip().casefold() == key), None)
        return Rejected(f"missing {key}" + (f" (the record has {other!r}: field names are lower case)" if other else ""))
    if not isinstance(value, str):
        hint = (" (an integer id column with missing values reads as float: write the ids as strings or integers)"
                if key == "product_id" and isinstance(value, float) else "")
        return Rejected(f"{key} must be a string, got {type(value).__name__}{hint}")
    if not _is_valid_text(value):
        return Rejected(f"{key} is not valid Unicode (lone surrogate)")
    if required and not value.strip():
        return Rejected(f"empty {key}")
    return value


def _features(record: dict) -> tuple[str, ...] | Rejected:
    value = record.get("features")
    if value is None:
        return ()
    if not isinstance(value, list):
        return Rejected(f"features must be a list of strings, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, str):
            return Rejected(f"features must be a list of strings, found {type(item).__name__}")
        if not _is_valid_text(item):
            return Rejected("features is not valid Unicode (lone surrogate)")
    return tuple(value)


def _fit(title: str, description: str | None, features: tuple[str, ...], budget: int):
    """Cut the text to ``budget`` characters: title first, then description, then features."""
    title = title[:budget]
    budget -= len(title)
    if description is not None:
        description = description[:budget]
        budget -= len(description)
    kept = []
    for feature in features:
        if budget <= 0:
            break
        kept.append(feature[:budget])
        budget -= len(kept[-1])
    return title, description or None, tuple(kept)


def id_of(value: object) -> object:
    """A product_id as the project reads it: an integer (a Parquet int64 column, a number in JSON) as
    its decimal string, since catalogs number their products and ids are strings everywhere after
    reading; anything else as it is (a float or a bool is then rejected as not a string)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _integer_id(record: dict) -> dict:
    """The record with ``id_of`` its product_id."""
    product_id = record.get("product_id")
    return record if id_of(product_id) is product_id else {**record, "product_id": id_of(product_id)}


def record_id(value: object) -> str | None:
    """The record's product_id if it is a usable string (non-blank, valid Unicode; an integer as its
    decimal string), even when the record fails validation otherwise: rejected rows keep it, and
    --skip-existing matches on it."""
    product_id = _integer_id(value).get("product_id") if isinstance(value, dict) else None
    if not isinstance(product_id, str) or not product_id.strip() or not _is_valid_text(product_id):
        return None
    return product_id


def validate_record(record: object, schema: AttributeSchema, config: ValidationConfig) -> Accepted | Rejected:
    """Check one parsed input record against the schema and limits."""
    if not isinstance(record, dict):
        hint = " (JSON Lines: one object per line, not an array)" if isinstance(record, list) else ""
        return Rejected(f"record must be a JSON object, got {type(record).__name__}{hint}")
    record = _integer_id(record)
    fields = {}
    for key in ("product_id", "category", "title"):
        value = _string_field(record, key, required=True)
        if isinstance(value, Rejected):
            return value
        fields[key] = value
    description = _string_field(record, "description", required=False)
    if isinstance(description, Rejected):
        return description
    features = _features(record)
    if isinstance(features, Rejected):
        return features
    if len(fields["product_id"]) > config.max_id_chars:
        return Rejected(f"product_id longer than {config.max_id_chars} characters")
    if fields["category"] not in schema.categories:  # named: a typo in the records or a category the schema lacks
        near = schema.near(fields["category"])
        hint = (f"; the schema has {near!r}: categories are matched exactly" if near is not None
                and near.casefold() == fields["category"].strip().casefold() else
                f"; did you mean {near!r}? categories are matched exactly" if near is not None else "")
        return Rejected(f"unknown category {fields['category'][:100]!r} (not in the attribute schema, --attributes{hint})")
    size = len(fields["title"]) + len(description or "") + sum(len(f) for f in features)
    truncated = size > config.max_text_chars
    title = fields["title"]
    if truncated:
        if config.oversize == "reject":
            return Rejected(f"text longer than {config.max_text_chars} characters ({size})")
        title, description, features = _fit(title, description, features, config.max_text_chars)
    product = Product(fields["product_id"], title, description, features)
    return Accepted(product, fields["category"], truncated)
