"""Print a few products of an `hpd extract` output: title (from the job's input), then each
attribute's value (and its confidence when the job wrote one). The quickstart ends with it, so
a first run shows what the job extracted without opening Parquet.

    python scripts/show_values.py OUTPUT [--input RECORDS] [--products 3]

RECORDS: any input `hpd extract` reads (JSON Lines, gzipped or not, Parquet, a folder or prefix of
them, local or s3://); by default the input the job's ``_job.json`` names.

It reads the output's files one at a time and stops once it has the products to show (a product's
values are all in one file: one per category and chunk, or a run of them packed whole by `hpd
compact`), and the input only up to their titles, so
it is quick on a catalog's output too. The products are the first of the first files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datafiles.predictions import attribute_files, read_columns  # noqa: E402
from pipelines import io, reader  # noqa: E402
from pipelines.reader import ReadConfig  # noqa: E402
from pipelines.schema import id_of  # noqa: E402


def first_products(output: str, products: int) -> dict[str, list[tuple[str, object, float | None]]]:
    """product_id -> [(attribute, value, confidence)] for the first ``products`` products."""
    shown: dict[str, list[tuple[str, object, float | None]]] = {}
    for fragment in attribute_files(output):
        table = read_columns(fragment, optional=("confidence",))
        sure = table.get("confidence", [None] * len(table["product_id"]))
        for pid, attribute, value, confidence in zip(table["product_id"], table["attribute"], table["value"], sure):
            if pid in shown or len(shown) < products:
                shown.setdefault(pid, []).append((attribute, value, confidence))
        if len(shown) >= products:
            break
    return shown


def titles(records: str, wanted: set[str]) -> dict[str, tuple[str, str]]:
    """product_id -> (title, category) for the wanted ids, reading the input (through the job's own
    reader) up to them."""
    found: dict[str, tuple[str, str]] = {}
    read = ReadConfig(records)
    for shard in reader.plan_input(read).shards:
        for raw in reader.iter_records(shard, read):
            row = raw.value if raw.error is None else None  # the job rejected such rows; nothing of it is shown
            if isinstance(row, dict) and id_of(row.get("product_id")) in wanted:
                found.setdefault(id_of(row["product_id"]), (str(row.get("title")), str(row.get("category"))))
                if len(found) == len(wanted):
                    return found
    return found


def job_input(output: str) -> str:
    """The input the job in ``output`` read, as its ``_job.json`` names it."""
    marker = io.join(output, "_job.json")
    if not io.exists(marker):
        if not io.exists(output) and not io.list_files(output):
            raise ValueError(f"{output} does not exist: pass the output directory of `hpd extract`")
        raise ValueError(f"{output} has no _job.json to name its input: pass --input")
    uri = (io.read_json(marker).get("arguments") or {}).get("input")
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{marker} does not name the job's input: pass --input")
    return uri


def render(output: str, records: str, products: int) -> str:
    shown = first_products(output, products)
    named = titles(records, set(shown))
    lines = [f"{len(shown)} product{'' if len(shown) == 1 else 's'} of {output}/attributes/:"]
    for pid, values in shown.items():
        title, category = named.get(pid, (f"(not in {records})", "?"))
        lines.append(f"  {title}  ({category}, {pid})")
        for attribute, value, confidence in values:
            lines.append(f"    {attribute}: {'null' if value is None else value}"
                         + ("" if confidence is None else f"   (confidence {confidence:.2f})"))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the output directory of `hpd extract` (local or s3://)")
    parser.add_argument("--input", help="the job's input records, for the titles (default: the input its _job.json names)")
    parser.add_argument("--products", type=int, default=3, help="how many products (default: 3)")
    args = parser.parse_args(argv)
    try:
        print(render(args.output, args.input or job_input(args.output), args.products))
    except (ValueError, OSError) as err:
        print(f"show_values: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
