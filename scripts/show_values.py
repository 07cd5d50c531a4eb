"""Print a few products of an `hpd extract` output: title (from the job's input), then each
attribute's value (and its confidence when the job wrote one). The quickstart ends with it, so
a first run shows what the job extracted without opening Parquet.

    python scripts/show_values.py OUTPUT --input RECORDS.jsonl [--products 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datafiles.dataset import read_records  # noqa: E402
from datafiles.predictions import read_predictions  # noqa: E402


def render(output: str, records: list[dict], products: int) -> str:
    predictions = read_predictions(output)
    shown = [r for r in records if r["product_id"] in predictions.values][:products]
    lines = [f"{len(shown)} of the {len(predictions.values)} products in {output}/attributes/:"]
    for record in shown:
        pid = record["product_id"]
        lines.append(f"  {record['title']}  ({record['category']}, {pid})")
        for attribute, value in predictions.values[pid].items():
            sure = predictions.confidence.get(pid, {}).get(attribute)
            lines.append(f"    {attribute}: {'null' if value is None else value}"
                         + ("" if sure is None else f"   (confidence {sure:.2f})"))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the output directory of `hpd extract` (local)")
    parser.add_argument("--input", required=True, help="the job's input records (JSON Lines), for the titles")
    parser.add_argument("--products", type=int, default=3, help="how many products (default: 3)")
    args = parser.parse_args(argv)
    print(render(args.output, read_records(args.input), args.products))
    return 0


if __name__ == "__main__":
    sys.exit(main())
