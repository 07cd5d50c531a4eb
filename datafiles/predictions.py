"""Reading the output of `hpd extract`: ``URI/attributes/category=<escaped>/*.parquet``, Hive-partitioned
rows ``{product_id, attribute, value, truncated, ...}``, local or on S3.

Each file is read on its own (``partitioning=None``); its category is the URL-unquoted value of its
``category=`` directory, or the file's own ``category`` column where it has one (outputs written
before 2026-11-24, and hand-made prediction files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

from datafiles.storage import resolve

PREDICTIONS_DIR = "attributes"
REQUIRED_COLUMNS = ("product_id", "attribute", "value")
PARTITION_KEY = "category"


@dataclass(frozen=True)
class Predictions:
    """Prediction rows folded to product_id -> attribute -> value, plus what was seen on the way."""

    values: dict[str, dict[str, object]]
    categories: dict[str, str | None]  # product_id -> predicted category
    rows: int
    files: int
    truncated: int = 0
    # product_id -> attribute -> the value's probability (outputs of `hpd extract --confidence`)
    confidence: dict[str, dict[str, float]] = field(default_factory=dict)


def attribute_files(uri: str, what: str = "predictions") -> list:
    """The Parquet fragments under ``URI/attributes/``; ``what`` names them in errors."""
    import pyarrow.dataset as ds

    filesystem, base = resolve(uri)
    root = f"{base}/{PREDICTIONS_DIR}"
    try:
        fragments = list(ds.dataset(root, filesystem=filesystem, format="parquet", partitioning=None).get_fragments())
    except FileNotFoundError as err:
        raise ValueError(f"no {what} at {uri}/{PREDICTIONS_DIR}/: pass the output directory of `hpd extract`") from err
    if not fragments:
        raise ValueError(f"no Parquet files under {uri}/{PREDICTIONS_DIR}/: pass the output directory of `hpd extract`")
    return fragments


def read_columns(fragment, optional: tuple[str, ...] = ()) -> dict[str, list]:
    """The required columns of one file, and those of ``optional`` that it has, as lists."""
    schema = fragment.physical_schema
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        raise ValueError(
            f"{fragment.path}: missing column(s) {missing}; expected {list(REQUIRED_COLUMNS)} (is this `hpd extract` output?)"
        )
    columns = [c for c in (*REQUIRED_COLUMNS, *optional) if c in schema.names]
    return fragment.to_table(schema=schema, columns=columns).to_pydict()


def _partition_category(path: str) -> str | None:
    """The URL-unquoted value of the innermost ``category=...`` directory in ``path``, if any."""
    values = [unquote(part.split("=", 1)[1]) for part in path.split("/") if part.startswith(f"{PARTITION_KEY}=")]
    return values[-1] if values else None


def read_predictions(uri: str) -> Predictions:
    """Read every Parquet file under ``URI/attributes/`` (see module doc for the category rule)."""
    fragments = attribute_files(uri)
    values: dict[str, dict[str, object]] = {}
    categories: dict[str, str | None] = {}
    confidence: dict[str, dict[str, float]] = {}
    rows = truncated = 0
    for fragment in fragments:
        table = read_columns(fragment, optional=("category", "truncated", "confidence"))
        n_rows = len(table["product_id"])
        file_categories = table.get("category", [_partition_category(fragment.path)] * n_rows)
        for i, (product_id, attribute, value) in enumerate(zip(table["product_id"], table["attribute"], table["value"])):
            per_product = values.setdefault(product_id, {})
            if attribute in per_product:
                raise ValueError(f"{fragment.path}: duplicate prediction for product {product_id!r}, attribute {attribute!r}")
            per_product[attribute] = value
            categories.setdefault(product_id, file_categories[i])
            sure = table["confidence"][i] if "confidence" in table else None
            if sure is not None:
                confidence.setdefault(product_id, {})[attribute] = sure
        truncated += sum(1 for flag in table.get("truncated", ()) if flag)
        rows += n_rows
    return Predictions(values, categories, rows, len(fragments), truncated, confidence)
