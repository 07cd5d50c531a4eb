"""`hpd evaluate` on a generated output of many products against a few hundred labelled ones:
its peak memory and time.

    python scripts/pick_scale.py build --products 1000000 --work /tmp/eval-1m
    python scripts/evaluate_scale.py gold --work /tmp/eval-1m --count 200
    python scripts/evaluate_scale.py run --work /tmp/eval-1m --repo . --out /tmp/eval-1m/new.json

``gold`` writes ``labelled/gold.jsonl`` and ``labelled/attributes.json``: ``--count`` products of the
built output's input spread through it, their Brand and Color as pick_scale's output predicts them
except every fifth Color (a miss), and no records file beside (no leakage figure). ``run`` times
``hpd evaluate --no-write`` from ``--repo`` on it under ``/usr/bin/time -v`` (wall, CPU, maximum
resident set size, and that of ``hpd evaluate --help``: the CLI's start-up), ``--compare`` the same
output when asked (the output read twice), and writes the figures with the summary line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from pick_scale import COLORS, _time_v  # noqa: E402 (scripts/ is on the path when run as a script)


def write_gold(work: Path, count: int) -> None:
    records = (work / "records.jsonl").read_text().splitlines()
    step = len(records) // count
    labelled = work / "labelled"
    labelled.mkdir(exist_ok=True)
    lines = []
    for i in range(count):
        record = json.loads(records[i * step])
        row = int(record["product_id"][1:])
        color = COLORS[row % len(COLORS)] if i % 5 else "purple"
        scores = {"Brand": {"Acme": 1}, "Color": {"n/a": 1} if color is None else {color: 1}}
        lines.append(json.dumps({"product_id": record["product_id"], "category": record["category"], "target_scores": scores}))
    (labelled / "gold.jsonl").write_text("\n".join(lines) + "\n")
    (labelled / "attributes.json").write_text((work / "attributes.json").read_text())


def measure(work: Path, repo: Path, compare: bool) -> dict:
    labelled = work / "labelled"
    arguments = ["evaluate", "--predictions", str(work / "run"), "--gold", str(labelled / "gold.jsonl"),
                 "--attributes", str(labelled / "attributes.json"), "--no-write"]
    if compare:
        arguments += ["--compare", str(work / "run"), "--draws", "200"]
    started = time.time()
    done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "jobs.cli", *arguments], cwd=repo,
                          capture_output=True, text=True)
    wall = time.time() - started
    figures = _time_v(done)
    help_only = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "jobs.cli", "evaluate", "--help"], cwd=repo,
                               capture_output=True, text=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "compare": compare, "wall_s": round(wall, 1), **figures,
            "start_up_max_rss_mib": _time_v(help_only)["max_rss_mib"], "summary": json.loads(done.stdout.splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gold")
    g.add_argument("--work", type=Path, required=True)
    g.add_argument("--count", type=int, default=200)
    r = sub.add_parser("run")
    r.add_argument("--work", type=Path, required=True)
    r.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout whose `hpd evaluate` runs")
    r.add_argument("--compare", action="store_true", help="also --compare the same output (read twice)")
    r.add_argument("--out", type=Path, help="write the figures here as JSON too")
    args = parser.parse_args()
    if args.command == "gold":
        write_gold(args.work, args.count)
        return
    figures = measure(args.work, args.repo.resolve(), args.compare)
    print(json.dumps(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
