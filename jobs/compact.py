"""`hpd compact OUTPUT_URI`: pack a finished `hpd extract` output's small Parquet files into few.

The compaction is ``pipelines.compact``; this module is its command line. Progress goes to stderr,
the last stdout line is one JSON summary (files and bytes before and after, partitions, seconds).
"""

from __future__ import annotations

import argparse
import json
import sys

from pipelines.compact import CompactConfig, Result, compact

DEFAULTS = CompactConfig("-")
INTERRUPTED = "the same command finishes the compaction (until then, readers should not read the output)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="a finished `hpd extract` output (local folder or s3:// prefix)")
    parser.add_argument("--target-mb", type=int, default=DEFAULTS.target_mb,
                        help="the most input MiB packed into one new file; files of half of it or more stay as they "
                        f"are (default: {DEFAULTS.target_mb})")
    parser.add_argument("--workers", type=int, default=DEFAULTS.workers,
                        help=f"partitions compacted at once, in threads (default: {DEFAULTS.workers})")
    parser.add_argument("--dry-run", action="store_true", help="say what would be packed; write nothing")


def run(args: argparse.Namespace) -> int:
    config = CompactConfig(args.output, target_mb=args.target_mb, workers=args.workers, dry_run=args.dry_run)
    result = compact(config)
    if config.dry_run:
        print(describe(result), file=sys.stderr)
    else:
        f = result.figures
        print(f"hpd compact: {result.output}: {f.files_before:,} -> {f.files_after:,} files ({f.bytes_before:,} -> "
              f"{f.bytes_after:,} bytes) in {f.partitions} partitions, {result.seconds:.1f} s", file=sys.stderr)
    print(json.dumps(result.as_json()))
    return 0


def describe(result: Result, limit: int = 20) -> str:
    """A dry run's plan for a person: the partitions with groups to pack (the first ``limit``)."""
    f = result.figures
    lines = [f"hpd compact --dry-run: {f.partitions} partitions, {f.files_before:,} files ({f.bytes_before:,} bytes) "
             + (f"-> {f.files_after:,} files: {f.groups:,} groups to pack in {len(result.planned)} partitions"
                if result.planned else "-> nothing to pack (no partition has two files to pack into one)")]
    if result.left_groups:
        lines.append(f"  first: {result.left_groups} group(s) a stopped compaction left, to finish or undo")
    for partition, groups in result.planned[:limit]:
        size = sum(file.size for group in groups for file in group)
        lines.append(f"  {partition}: {sum(len(g) for g in groups)} files ({size:,} bytes) -> {len(groups)}")
    if len(result.planned) > limit:
        lines.append(f"  ... and {len(result.planned) - limit} more partitions")
    return "\n".join(lines)
