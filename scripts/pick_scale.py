"""`hpd pick` on a generated output of many products: its peak memory and time.

    python scripts/pick_scale.py build --products 1000000 --work /tmp/pick-1m
    python scripts/pick_scale.py run --work /tmp/pick-1m --repo . --out /tmp/pick-1m/new.json

``build`` writes what an `hpd extract` job leaves: ``records.jsonl`` (titles only), ``attributes.json``
(``--categories`` categories of three attributes, of unequal sizes: category i holds a share i + 1),
and ``run/``: ``attributes/category=<c>/<chunk>.parquet`` (the job's columns less the category, one
file per chunk of ``--chunk-rows`` input rows and category, as pipelines/commit.py names them) and
``_job.json`` with the schema's digest and the input. ``run`` times ``hpd pick`` from ``--repo`` on it
under ``/usr/bin/time -v`` (the maximum resident set size of the process, and that of ``hpd pick
--help`` alone: the CLI's start-up) and writes the figures; with ``--tracemalloc`` it runs the command
in a Python that traces its allocations (after importing its modules) and reports the peak of the
Python objects it held (pyarrow's own buffers are not traced).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("Brand", "Color", "Size")
COLORS = ("red", "blue", None, "green")


def category_of(row: int, categories: int) -> str:
    """Category i holds a share i + 1 of the rows, spread through the input."""
    weights = [i + 1 for i in range(categories)]
    point = (row * 2654435761) % sum(weights)
    for i, weight in enumerate(weights):
        if point < weight:
            return f"Category {i}"
        point -= weight
    raise AssertionError("unreachable")


def build(work: Path, products: int, categories: int, chunk_rows: int) -> None:
    sys.path.insert(0, str(REPO))
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.commit import ATTRIBUTES_SCHEMA, PARTITION_COLUMN
    from pipelines.schema import load_schema, partition_value

    work.mkdir(parents=True, exist_ok=False)
    (work / "attributes.json").write_text(json.dumps({f"Category {i}": list(ATTRIBUTES) for i in range(categories)}))
    schema = ATTRIBUTES_SCHEMA.remove(ATTRIBUTES_SCHEMA.get_field_index(PARTITION_COLUMN))
    output = work / "run"
    with open(work / "records.jsonl", "w") as records:
        for chunk, start in enumerate(range(0, products, chunk_rows)):
            rows = range(start, min(start + chunk_rows, products))
            by_category: dict[str, list[int]] = {}
            lines = []
            for row in rows:
                category = category_of(row, categories)
                by_category.setdefault(category, []).append(row)
                lines.append(json.dumps({"product_id": f"p{row:010d}", "category": category,
                                         "title": f"Product {row} red cotton shirt size M"}))
            records.write("\n".join(lines) + "\n")
            for category, mine in by_category.items():
                n = len(mine) * len(ATTRIBUTES)
                table = pa.table({
                    "product_id": [f"p{row:010d}" for row in mine for _ in ATTRIBUTES],
                    "attribute": list(ATTRIBUTES) * len(mine),
                    "value": [v for row in mine for v in ("Acme", COLORS[row % len(COLORS)], None)],
                    "truncated": [False] * n, "decoder": ["dry-run"] * n, "model": ["none"] * n, "run_id": ["r"] * n,
                }, schema=schema)
                part = output / "attributes" / f"{PARTITION_COLUMN}={partition_value(category)}"
                part.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, part / f"{chunk:06d}.parquet")
    digest = load_schema(str(work / "attributes.json")).digest()
    (output / "_job.json").write_text(json.dumps({"run_id": "r", "arguments": {
        "attributes": digest, "input": str(work / "records.jsonl")}}))


TRACED = """
import json, sys, tracemalloc
import jobs.pick, pipelines.reader, datafiles.predictions, pyarrow.parquet, pyarrow.compute, pandas  # pyarrow imports pandas as it reads
from jobs.cli import build_parser, main
build_parser()  # every subcommand's module imported (torch too) before the trace starts
tracemalloc.start()
code = main(sys.argv[1:])
print(json.dumps({"tracemalloc_peak_mib": round(tracemalloc.get_traced_memory()[1] / 2**20, 1)}))
sys.exit(code)
"""


def _time_v(done: subprocess.CompletedProcess) -> dict:
    if done.returncode != 0:
        raise SystemExit(f"hpd pick failed ({done.returncode}):\n{done.stderr[-3000:]}")
    field = lambda name: re.search(rf"{name}: ([\d.]+)", done.stderr)[1]  # noqa: E731
    return {"cpu_s": round(float(field(r"User time \(seconds\)")) + float(field(r"System time \(seconds\)")), 1),
            "max_rss_mib": round(int(field(r"Maximum resident set size \(kbytes\)")) / 1024, 1)}


def measure(work: Path, repo: Path, count: int, seed: int, traced: bool) -> dict:
    label = work / f"label-{time.time_ns()}"
    arguments = ["pick", str(work / "run"), "--attributes", str(work / "attributes.json"), "--count", str(count),
                 "--seed", str(seed), "--out", str(label)]
    python = [sys.executable, "-c", TRACED] if traced else ["/usr/bin/time", "-v", sys.executable, "-m", "jobs.cli"]
    started = time.time()
    done = subprocess.run([*python, *arguments], cwd=repo, capture_output=True, text=True)
    wall = time.time() - started
    figures = json.loads(done.stdout.splitlines()[-1]) if traced and done.returncode == 0 else _time_v(done)
    if not traced:
        help_only = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "jobs.cli", "pick", "--help"], cwd=repo,
                                   capture_output=True, text=True)
        figures["start_up_max_rss_mib"] = _time_v(help_only)["max_rss_mib"]
    summary = json.loads(done.stdout.splitlines()[-2 if traced else -1])
    picked = [json.loads(line)["product_id"] for line in (label / "records.jsonl").read_text().splitlines()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "wall_s": round(wall, 1), **figures, "summary": summary, "picked_first": picked[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--products", type=int, default=1_000_000)
    b.add_argument("--categories", type=int, default=10)
    b.add_argument("--chunk-rows", type=int, default=2048, help="input rows per chunk (ReadConfig's default)")
    b.add_argument("--work", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--work", type=Path, required=True)
    r.add_argument("--repo", type=Path, default=REPO, help="the checkout whose `hpd pick` runs")
    r.add_argument("--count", type=int, default=200)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--tracemalloc", action="store_true", help="the peak of traced Python allocations instead")
    r.add_argument("--out", type=Path, help="write the figures here as JSON too")
    args = parser.parse_args()
    if args.command == "build":
        started = time.time()
        build(args.work, args.products, args.categories, args.chunk_rows)
        print(f"built {args.work} in {time.time() - started:.0f}s")
        return
    figures = measure(args.work, args.repo.resolve(), args.count, args.seed, args.tracemalloc)
    print(json.dumps(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
