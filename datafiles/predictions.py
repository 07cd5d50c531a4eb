"""Reading the output of `hpd extract`: ``URI/attributes/category=<escaped>/*.parquet``, Hive-partitioned
rows ``{product_id, attribute, value, truncated, ...}``, local or on S3.

Each file is read on its own (``partitioning=None``); its category is the URL-unquoted value of its
``category=`` directory, or the file's own ``category`` column where it has one (outputs written
before 2026-11-24, and hand-made prediction files).

``read_predictions`` folds the whole output into memory (the slow reference); ``read_predictions(uri,
only=ids)`` keeps the values of ``ids`` alone, still counting rows and products of the whole output
(what `hpd evaluate` does, a file at a time). For an output of any size, ``attribute_paths`` lists
its files one ``category=`` folder at a time, ``rows_by_category`` reads some columns of one file,
and ``read_values`` the values of a few products (what `hpd pick` does).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

from datafiles.storage import resolve

PREDICTIONS_DIR = "attributes"
REQUIRED_COLUMNS = ("product_id", "attribute", "value")
PARTITION_KEY = "category"
HIDDEN_PREFIXES = (".", "_")  # names pyarrow.dataset's discovery passes over (attribute_files)


@dataclass(frozen=True)
class Predictions:
    """Prediction rows folded to product_id -> attribute -> value, plus what was seen on the way.
    ``values``, ``categories`` and ``confidence`` hold every product, or those asked for
    (``read_predictions(uri, only=...)``); the other fields count the whole output either way."""

    values: dict[str, dict[str, object]]
    categories: dict[str, str | None]  # product_id -> predicted category
    rows: int
    files: int
    truncated: int = 0
    # product_id -> attribute -> the value's probability (outputs of `hpd extract --confidence`)
    confidence: dict[str, dict[str, float]] = field(default_factory=dict)
    products: int = 0  # distinct product ids of the whole output
    least_id: object = None  # the smallest of them (for messages); None: no rows
    # category -> the attribute names of its products' values, over the whole output
    attributes: dict[str | None, frozenset] = field(default_factory=dict)
    # of the products ``values`` holds, those with a row flagged ``truncated`` (a value cut at K_max,
    # or the product's text cut)
    truncated_products: set = field(default_factory=set)


def stored_threshold(threshold: float) -> float:
    """``threshold`` rounded as the float32 ``confidence`` column stores its values, so that a value
    written as 0.9 counts as at least 0.9 (``hpd evaluate``'s table and ``hpd finetune
    --min-confidence`` alike)."""
    return struct.unpack("f", struct.pack("f", threshold))[0]


def attribute_files(uri: str, what: str = "predictions") -> list:
    """The Parquet fragments under ``URI/attributes/``; ``what`` names them in errors."""
    import pyarrow.dataset as ds

    filesystem, base = resolve(uri)
    _check_not_compacting(filesystem, base, uri)
    root = f"{base}/{PREDICTIONS_DIR}"
    try:
        fragments = list(ds.dataset(root, filesystem=filesystem, format="parquet", partitioning=None).get_fragments())
    except FileNotFoundError as err:
        raise ValueError(_no_values(filesystem, base, uri, what)) from err
    if not fragments:
        raise ValueError(_no_values(filesystem, base, uri, what))
    return fragments


def _no_values(filesystem, base: str, uri, what: str) -> str:
    """Why ``uri`` holds no values to read: it does not exist, it is a job that wrote none, or it is
    not an output of `hpd extract`."""
    from pyarrow import fs

    if filesystem.get_file_info(base).type == fs.FileType.NotFound:
        return f"{uri} does not exist: pass the output directory of `hpd extract`"
    if filesystem.get_file_info(f"{base}/_job.json").type == fs.FileType.File:
        return (f"the job in {uri} wrote no values (no Parquet files under {PREDICTIONS_DIR}/): every row was rejected, "
                "it had none, or it has not committed any yet; its _report.md (and `hpd rejected`) say which")
    if filesystem.get_file_info(f"{base}/{PREDICTIONS_DIR}").type == fs.FileType.Directory:
        return f"no Parquet files under {uri}/{PREDICTIONS_DIR}/: pass the output directory of `hpd extract`"
    return f"no {what} at {uri}/{PREDICTIONS_DIR}/: pass the output directory of `hpd extract`"


def _check_not_compacting(filesystem, base: str, uri) -> None:
    """``ValueError`` while `hpd compact` works on the output (or was stopped there): a group of its
    files may then be there twice, as the new file and its originals (pipelines/compact.py)."""
    from pyarrow import fs

    from pipelines.compact import MARKER, compacting_message

    if filesystem.get_file_info(f"{base}/{MARKER}").type != fs.FileType.NotFound:
        raise ValueError(compacting_message(str(uri)))


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


def read_predictions(uri: str, only: Collection[str] | None = None) -> Predictions:
    """Read every Parquet file under ``URI/attributes/`` (see module doc for the category rule);
    with ``only``, keep the values of those product ids alone (``_read_some``)."""
    from pipelines.compact import reading

    with reading(str(uri)):  # not while `hpd compact` moves its files, nor across one
        return _read_some(uri, only) if only is not None else _read_all(uri)


def _read_all(uri: str) -> Predictions:
    """``read_predictions`` of every product."""
    fragments = attribute_files(uri)
    values: dict[str, dict[str, object]] = {}
    categories: dict[str, str | None] = {}
    confidence: dict[str, dict[str, float]] = {}
    truncated_products: set = set()
    rows = truncated = 0
    for fragment in fragments:
        table = read_columns(fragment, optional=("category", "truncated", "confidence"))
        n_rows = len(table["product_id"])
        file_categories = table.get("category", [_partition_category(fragment.path)] * n_rows)
        _fold(fragment.path, table, file_categories, values, categories, confidence, truncated_products)
        truncated += sum(1 for flag in table.get("truncated", ()) if flag)
        rows += n_rows
    names: dict[str | None, set] = {}
    for product_id, per_product in values.items():
        names.setdefault(categories[product_id], set()).update(per_product)
    return Predictions(values, categories, rows, len(fragments), truncated, confidence, len(values),
                       min((p for p in values if p is not None), default=None, key=_id_order),
                       {c: frozenset(n) for c, n in names.items()}, truncated_products)


def _id_order(product_id: object) -> tuple[str, object]:
    """The order of ids for the least one: ids of one type by value, types by name (a hand-made
    output may mix string and integer ids in its files)."""
    return type(product_id).__name__, product_id


def _plain_ids(ids):
    """A product_id column as plain strings where it holds text in another type (dictionary-encoded,
    as pandas writes a categorical column; large or view strings; all null), which some of Arrow's
    functions do not take; numbers stay numbers (``read_predictions`` keeps them as they are)."""
    import pyarrow as pa

    if pa.types.is_dictionary(ids.type):
        ids = ids.cast(ids.type.value_type)
    if pa.types.is_null(ids.type) or pa.types.is_large_string(ids.type) or pa.types.is_string_view(ids.type):
        ids = ids.cast(pa.string())
    return ids


def _fold(path: str, table: dict[str, list], file_categories: list, values: dict, categories: dict,
          confidence: dict, truncated_products: set) -> None:
    """Add one file's rows (``table``: columns as lists) to product_id -> attribute -> value, the
    products' categories (their first row's), confidences and the products with a truncated row; a
    product given an attribute twice is refused."""
    flags = table.get("truncated") or ()
    for i, (product_id, attribute, value) in enumerate(zip(table["product_id"], table["attribute"], table["value"])):
        per_product = values.setdefault(product_id, {})
        if attribute in per_product:
            raise ValueError(f"{path}: duplicate prediction for product {product_id!r}, attribute {attribute!r}")
        per_product[attribute] = value
        categories.setdefault(product_id, file_categories[i])
        sure = table["confidence"][i] if "confidence" in table else None
        if sure is not None:
            confidence.setdefault(product_id, {})[attribute] = sure
        if flags and flags[i]:
            truncated_products.add(product_id)


def _read_some(uri: str, only: Collection[str]) -> Predictions:
    """``read_predictions`` keeping the values, categories and confidences of the products ``only``,
    holding one file's columns at a time: of every file the product_id, attribute, category and
    truncated columns (rows, products, attribute names per category, duplicates), and the value and
    confidence columns only of the files that hold a product of ``only``.

    Products are counted file by file (distinct ids in each), the category of an attribute name
    is its row's: exact for `hpd extract` outputs, which write all of a product's rows to one file
    (pipelines/commit.py: a file per chunk of input rows and category, or, once `hpd compact` ran,
    a run of such files packed whole into one, pipelines/compact.py; a product id seen again is
    rejected as a duplicate, pipelines/dedup.py). Of a hand-made output that splits a product over
    files it is counted once per file (and its names go to each row's category, not its first row's),
    and a product given an attribute twice is refused within a file, or across files where it is one
    of ``only``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    filesystem, paths = attribute_paths(uri)
    values: dict[str, dict[str, object]] = {}
    categories: dict[str, str | None] = {}
    confidence: dict[str, dict[str, float]] = {}
    truncated_products: set = set()
    names: dict[str | None, set] = {}
    rows = truncated = products = files = 0
    least = None
    only = only if isinstance(only, (set, frozenset)) else set(only)
    wanted_ids = sorted(p for p in only if isinstance(p, str))
    value_sets: dict[pa.DataType, pa.Array] = {}  # ``only`` as an array of each id type met: built once, not per file
    for path in paths:
        files += 1
        file = _open(filesystem, path)
        present = file.schema_arrow.names
        table = file.read(columns=[c for c in ("product_id", "attribute", PARTITION_KEY, "truncated") if c in present])
        ids = _plain_ids(table["product_id"])
        table = table.set_column(table.schema.get_field_index("product_id"), "product_id", ids)
        rows += table.num_rows
        products += pc.count_distinct(ids, mode="all").as_py()
        if (low := pc.min(ids).as_py()) is not None:
            least = low if least is None else min(least, low, key=_id_order)
        if "truncated" in present:
            flags = table["truncated"]
            truncated += (pc.sum(flags).as_py() or 0) if pa.types.is_boolean(flags.type) else \
                sum(1 for flag in flags.to_pylist() if flag)
        if PARTITION_KEY in present:
            pairs = table.group_by([PARTITION_KEY, "attribute"]).aggregate([]).to_pydict()
            for category, attribute in zip(pairs[PARTITION_KEY], pairs["attribute"]):
                names.setdefault(category, set()).add(attribute)
        elif table.num_rows:
            names.setdefault(_partition_category(path), set()).update(pc.unique(table["attribute"]).to_pylist())
        if table.group_by(["product_id", "attribute"]).aggregate([]).num_rows < table.num_rows:
            _refuse_duplicate(path, table, values)
        if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
            continue  # ids that are not strings are none of ``only`` (read_predictions keeps them as they are)
        if len(ids) * 4 < len(wanted_ids):  # a small file (a chunk's): look its ids up, not build a set of ``only``
            held = pa.array([product_id in only for product_id in ids.to_pylist()], type=pa.bool_())
        else:
            if ids.type not in value_sets:
                value_sets[ids.type] = pa.array(wanted_ids, type=ids.type)
            held = pc.is_in(ids, value_set=value_sets[ids.type])
        if not pc.any(held).as_py():
            continue
        kept = [c for c in (*REQUIRED_COLUMNS, PARTITION_KEY, "truncated", "confidence") if c in present]
        wanted = file.read(columns=kept).set_column(0, "product_id", ids).filter(held).to_pydict()  # kept[0]: product_id
        file_categories = wanted.get(PARTITION_KEY, [_partition_category(path)] * len(wanted["product_id"]))
        _fold(path, wanted, file_categories, values, categories, confidence, truncated_products)
    return Predictions(values, categories, rows, files, truncated, confidence, products, least,
                       {c: frozenset(n) for c, n in names.items()}, truncated_products)


def _refuse_duplicate(path: str, table, earlier: dict[str, dict[str, object]]) -> None:
    """``read_predictions``' error at the first row of ``table`` (one file's product_id and attribute)
    that repeats a (product, attribute) of the file, or of ``earlier`` (from the files before)."""
    seen = set()
    for product_id, attribute in zip(table["product_id"].to_pylist(), table["attribute"].to_pylist()):
        if (product_id, attribute) in seen or attribute in earlier.get(product_id, ()):
            raise ValueError(f"{path}: duplicate prediction for product {product_id!r}, attribute {attribute!r}")
        seen.add((product_id, attribute))


def attribute_paths(uri: str, what: str = "predictions"):
    """``(file system, paths)``: the files under ``URI/attributes/`` that ``attribute_files`` reads
    (names starting ``.`` or ``_`` passed over), listed one top-level folder (a category) at a time as
    the paths are consumed, so that a listing holds one category's files, not the output's."""
    from pyarrow import fs

    filesystem, base = resolve(uri)
    _check_not_compacting(filesystem, base, uri)
    root = f"{base}/{PREDICTIONS_DIR}"
    try:
        entries = filesystem.get_file_info(fs.FileSelector(root, allow_not_found=False))
    except FileNotFoundError as err:
        raise ValueError(_no_values(filesystem, base, uri, what)) from err

    def visible(path: str) -> bool:
        return not any(part.startswith(HIDDEN_PREFIXES) for part in path[len(root):].split("/") if part)

    def paths() -> Iterator[str]:
        found = False
        # in the order of the files' full paths, as pyarrow.dataset lists them: a folder's files
        # come where "folder/" sorts ("category=a-b/" before "category=a/")
        for entry in sorted(entries, key=lambda e: e.path + ("/" if e.type == fs.FileType.Directory else "")):
            if not visible(entry.path):
                continue
            inside = [entry] if entry.type == fs.FileType.File else \
                filesystem.get_file_info(fs.FileSelector(entry.path, recursive=True))
            for file in sorted((f.path for f in inside if f.type == fs.FileType.File and visible(f.path))):
                found = True
                yield file
        if not found:
            raise ValueError(_no_values(filesystem, base, uri, what))

    return filesystem, paths()


def _ids_as_text(table):
    """``table`` with its product_id column as strings (ids are strings everywhere after reading)."""
    import pyarrow as pa

    at = table.schema.get_field_index("product_id")
    if at < 0 or table.schema.field(at).type == pa.string():
        return table
    return table.set_column(at, "product_id", table["product_id"].cast(pa.string()))


def _open(filesystem, path: str):
    """One file as a ``pyarrow.parquet.ParquetFile``, its required columns checked (``read_columns``' message)."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(filesystem.open_input_file(path))
    missing = [c for c in REQUIRED_COLUMNS if c not in file.schema_arrow.names]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {missing}; expected {list(REQUIRED_COLUMNS)} (is this `hpd extract` output?)"
        )
    return file


def rows_by_category(filesystem, path: str, columns: tuple[str, ...]) -> dict[str | None, object]:
    """Of one file, ``columns`` (of ``REQUIRED_COLUMNS``) as a ``pyarrow.Table`` per category: its
    ``category=`` folder's, or row by row its ``category`` column's where it has one; ``None``: neither."""
    import pyarrow.compute as pc

    file = _open(filesystem, path)
    if PARTITION_KEY not in file.schema_arrow.names:
        return {_partition_category(path): _ids_as_text(file.read(columns=list(columns)))}
    table = _ids_as_text(file.read(columns=[*columns, PARTITION_KEY]))
    groups = {}
    for category in pc.unique(table[PARTITION_KEY]).to_pylist():
        held = pc.is_null(table[PARTITION_KEY]) if category is None else pc.equal(table[PARTITION_KEY], category)
        groups[category] = table.filter(held).select(list(columns))
    return groups


def read_values(filesystem, paths: Iterable[str], product_ids: Collection[str]) -> dict[str, dict[str, object]]:
    """product_id -> attribute -> value for ``product_ids``, from the files ``paths`` (those that
    hold them); a product given an attribute twice is refused, as by ``read_predictions``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = pa.array(sorted(product_ids), type=pa.string())
    values: dict[str, dict[str, object]] = {}
    for path in paths:
        table = _ids_as_text(_open(filesystem, path).read(columns=list(REQUIRED_COLUMNS)))
        table = table.filter(pc.is_in(table["product_id"], value_set=wanted)).to_pydict()
        _fold(path, table, [None] * len(table["product_id"]), values, {}, {}, set())  # the values alone
    return values
