"""`hpd rejected OUTPUT_URI`: what a finished job rejected, by stage and reason, and the original
records of those rows as JSON Lines (``--out``), to correct and run again.

The reading is ``pipelines.rejects``; this module is its command line. The counts go to stderr for
a person, the last stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from pipelines import io
from pipelines.rejects import STAGES, as_json, read_rejected, summary


RUN_AGAIN = tuple(stage for stage in STAGES if stage != "dedup")  # --out's stages unless --stage says


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="a finished `hpd extract` output (local folder or s3:// prefix)")
    parser.add_argument("--stage", choices=STAGES, action="append",
                        help="only the rows rejected at this stage; repeat it for several (default: every stage, and "
                        f"with --out every stage but dedup: {', '.join(RUN_AGAIN)}; a dedup row is a later copy of a "
                        "product the job wrote). extract: prompts the decoder failed on, e.g. too long for the "
                        "device even alone")
    parser.add_argument("--out", metavar="FILE",
                        help="write their original records here, one JSON line each (local path or s3:// URI), an "
                        "input for `hpd extract --input` (default: none, only the counts)")


def run(args: argparse.Namespace) -> int:
    stages = tuple(args.stage) if args.stage else None
    if not args.out:
        rejected = read_rejected(args.output, stages)
    else:  # written beside the target (or in the temp folder for S3), put in place only when complete
        local = not args.out.startswith("s3://")
        if local and (os.path.isdir(args.out) or args.out.endswith(os.sep)):
            raise ValueError(f"--out {args.out} is a folder: name the file to write, e.g. {os.path.join(args.out, 'rejected.jsonl')}")
        folder = os.path.dirname(os.path.abspath(args.out)) if local else None
        if folder:
            os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".hpd-rejected-", suffix=".jsonl", dir=folder)
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)  # as a plain open() would make it (mkstemp's is 0600)
            with os.fdopen(handle, "wb") as records:
                rejected = read_rejected(args.output, stages or RUN_AGAIN, records)
            io.put_file(temporary, args.out)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
    print(summary(rejected), file=sys.stderr)
    result = as_json(rejected)
    if args.out:
        dedup = rejected.left_out["dedup"] if not args.stage else 0
        print(f"records of {rejected.rows} row(s): {args.out}"
              + (f"; not of the {dedup} dedup row(s), later copies of products the job wrote (--stage dedup writes them)"
                 if dedup else ""), file=sys.stderr)
        result["out"] = args.out
    print(json.dumps(result))
    return 0
