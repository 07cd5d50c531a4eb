"""What `hpd compact` buys on an output of many categories: files, bytes and reading time before and after.

    python scripts/compact_scale.py --rows 200000 --categories 500 --out benchmarks/compact-scale

Writes titles-only records (each row of a category drawn at random, seeded; one row in 5,000 of an
unknown category, for rejected/), runs `hpd extract --decoder dry-run` on them with its own local
Ray, then measures the output (files, median file size and rows), `hpd evaluate` against 200 of its
products (twice; its JSON must not change) and a whole read with ``pyarrow.dataset``, runs `hpd
compact`, and measures again. Writes ``compact.json`` and ``compact.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ATTRIBUTES = ["Brand", "Color", "Size", "Material", "Style"]
GOLD_PRODUCTS = 200


def write_inputs(folder: Path, rows: int, categories: int, seed: int = 0) -> None:
    """input.jsonl (not records.jsonl, which `hpd evaluate` would read beside the gold for its leakage
    figure), attributes.json and gold.jsonl."""
    rng = random.Random(seed)
    names = [f"Category {i:04d}" for i in range(categories)]
    (folder / "attributes.json").write_text(json.dumps({name: ATTRIBUTES for name in names}))
    records = []
    for row in range(rows):
        category = "Unknown" if row % 5000 == 17 else names[rng.randrange(categories)]
        records.append({"product_id": f"p{row:09d}", "category": category, "title": f"Product {row} red cotton shirt"})
    (folder / "input.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    gold = rng.sample([r for r in records if r["category"] != "Unknown"], min(GOLD_PRODUCTS, rows))
    (folder / "gold.jsonl").write_text("".join(json.dumps({"product_id": r["product_id"], "category": r["category"],
                                                           "target_scores": {"Color": {"red": 1}}}) + "\n" for r in gold))


def hpd(*argv: str) -> tuple[float, str]:
    """Run an `hpd` command; (seconds, its last stdout line)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jobs.cli", *argv], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"hpd {argv[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done.stdout.strip().splitlines()[-1]


def measure(folder: Path) -> dict:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    output = folder / "out"
    files = sorted(p for part in ("attributes", "rejected") for p in (output / part).rglob("*.parquet"))
    sizes = [p.stat().st_size for p in files]
    rows = [pq.read_metadata(p).num_rows for p in files if "attributes" in p.parts]
    evaluate = [hpd("evaluate", "--predictions", str(output), "--gold", str(folder / "gold.jsonl"), "--no-write")
                for _ in range(2)]
    category = ds.partitioning(pa.schema([("category", pa.string())]), flavor="hive")
    started = time.perf_counter()
    values = ds.dataset(output / "attributes", format="parquet", partitioning=category).to_table()
    read = time.perf_counter() - started
    return {"files": len(files), "bytes": sum(sizes), "median_file_bytes": int(statistics.median(sizes)),
            "median_rows_per_attribute_file": int(statistics.median(rows)),
            "evaluate_seconds": [round(s, 2) for s, _ in evaluate], "evaluate": json.loads(evaluate[0][1]),
            "dataset_read_seconds": round(read, 2), "attribute_rows": values.num_rows}


def machine() -> str:
    """The CPU's model and count (Linux's /proc/cpuinfo; the platform's name elsewhere)."""
    try:
        models = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
    except OSError:
        models = []
    return f"{models[0] if models else platform.machine()}, {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--categories", type=int, default=500)
    parser.add_argument("--out", type=Path, required=True, help="folder for compact.json and compact.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compact-scale-") as work:
        folder = Path(work)
        write_inputs(folder, args.rows, args.categories)
        extract_seconds, _ = hpd("extract", "--input", str(folder / "input.jsonl"), "--attributes",
                                 str(folder / "attributes.json"), "--output", str(folder / "out"), "--decoder", "dry-run")
        before = measure(folder)
        compact_seconds, line = hpd("compact", str(folder / "out"))
        after = measure(folder)
    assert after["evaluate"] == before["evaluate"] and after["attribute_rows"] == before["attribute_rows"]
    result = {"rows": args.rows, "categories": args.categories, "machine": machine(), "extract_seconds": round(extract_seconds, 1),
              "compact_seconds": round(compact_seconds, 2), "compact": json.loads(line),
              "before": {k: v for k, v in before.items() if k != "evaluate"},
              "after": {k: v for k, v in after.items() if k != "evaluate"}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compact.json").write_text(json.dumps(result, indent=1) + "\n")
    b, a = result["before"], result["after"]
    table = [f"`hpd compact` on a `--decoder dry-run` output of {args.rows:,} rows in {args.categories:,} categories "
             f"(`python scripts/compact_scale.py --rows {args.rows} --categories {args.categories}`; `hpd compact` "
             f"took {compact_seconds:.1f} s, the CLI's start included)", "",
             "| | files | bytes | median file (bytes) | median rows a file | `hpd evaluate` (s, twice) | pyarrow.dataset read (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in (("before", b), ("after", a)):
        table.append(f"| {name} | {m['files']:,} | {m['bytes']:,} | {m['median_file_bytes']:,} | "
                     f"{m['median_rows_per_attribute_file']:,} | {', '.join(map(str, m['evaluate_seconds']))} | "
                     f"{m['dataset_read_seconds']} |")
    (args.out / "compact.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
