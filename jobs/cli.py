"""`hpd` command line: one subcommand per module in jobs/.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``. Heavy imports
(torch, transformers, ray) happen inside ``run`` so that ``hpd --help`` starts instantly.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys

from jobs import CommandFailed, Terminated, sigterm_stops_cleanly

# name -> (module, one-line help)
SUBCOMMANDS = {
    "extract": ("jobs.extract", "run the extraction job (Ray Data) from records to attribute Parquet"),
    "rejected": ("jobs.rejected", "the rows a finished job rejected: counts by stage and reason, their records to run again"),
    "compact": ("jobs.compact", "pack a finished job's small Parquet files into few (one partition's files together)"),
    "evaluate": ("jobs.evaluate", "score predictions against gold (ExtractGPT metric + strict)"),
    "convert": ("jobs.convert", "convert benchmark files (ExtractGPT JSONL) to records/attributes/gold, or a corrected labelling sheet (hpd pick's labels.csv) to gold"),
    "bench": ("jobs.bench", "throughput benchmark: baseline vs HPD side by side"),
    "finetune": ("jobs.finetune", "HPD-aligned (or baseline) LoRA fine-tuning / distillation"),
    "pick": ("jobs.pick", "a sample of a catalog's products to label (for finetune --init-adapter), every category in it, with a gold draft"),
}


def version() -> str:
    """The installed package's version (a checkout not installed: "unknown")."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("hpd-ave")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="hpd", description="HPD-AVE: attribute value extraction with Hyper-Parallel Decoding")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)  # a module that fails to import fails `hpd` itself
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    with sigterm_stops_cleanly():
        code = _run(args.command, modules[args.command], args)
    if code:
        # A failure's traceback holds the frames it went through in reference cycles, which only the
        # cyclic collector frees: among them those of a failed `hpd extract`'s Ray Data executor,
        # whose actor pool keeps its CPUs until it is freed. Freed now, a next command in this process
        # (tests, a notebook) starts at once (it waited 10-15 s for them on the 2-core sandbox).
        gc.collect()
    return code


def _run(command: str, module, args: argparse.Namespace) -> int:
    try:
        return int(module.run(args) or 0)
    except (OSError, ValueError) as err:  # bad paths, bad input, bad settings: say what, not where
        if os.environ.get("HPD_TRACEBACK"):
            raise
        print(f"hpd {command}: error: {_with_hint(err)}", file=sys.stderr)  # (HPD_TRACEBACK=1 raises it instead)
        return 2
    except CommandFailed as err:  # it started and failed: one message, not a traceback
        if os.environ.get("HPD_TRACEBACK"):
            raise
        print(f"hpd {command}: failed: {_with_hint(err, '(HPD_TRACEBACK=1 shows the traceback)')}", file=sys.stderr)
        return 1
    except Exception as err:  # boto3's errors are not OSErrors: those of a setting (S3's credentials, endpoint) too
        if os.environ.get("HPD_TRACEBACK") or not _boto_error(err) or _s3_hint(err) is None:
            raise  # any other error (a bug raised while an S3 error was handled included) keeps its traceback
        print(f"hpd {command}: error: {type(err).__name__}: {_with_hint(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
        hint = getattr(module, "INTERRUPTED", "")
        what = "stopped (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        print(f"\nhpd {command}: {what}{'; ' + hint if hint else ''}", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130


def _boto_error(err: BaseException) -> bool:
    """``err`` is boto3's, or was raised from one (``raise ... from``; not merely while handling one)."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return False
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, (BotoCoreError, ClientError)):
            return True
        seen = seen.__cause__
    return False


def _s3_hint(err: BaseException) -> str | None:
    from pipelines.io import s3_hint

    return s3_hint(err)


def _with_hint(err: BaseException, note: str = "") -> str:
    """The error's message, then ``note``, then what to check when an S3 setting is the likely cause."""
    said = " ".join(part for part in (str(err).rstrip(), note) if part)
    hint = _s3_hint(err)
    return said if hint is None else f"{said}{'' if said.endswith('.') else '.'} {hint}"


if __name__ == "__main__":
    sys.exit(main())
