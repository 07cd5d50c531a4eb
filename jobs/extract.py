"""`hpd extract`: run the extraction job (DESIGN.md section 1) on Ray Data.

Locally (no --address, no running cluster) it starts a Ray instance sized to the machine; under
`ray job submit` it joins the job's cluster. Run it again with the same arguments to resume.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys

from hpd_core.config import SKELETONS

DECODER_CHOICES = ("hpd", "ar", "reference", "dry-run")  # pipelines.extract_stage.EXTRACT_DECODERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="records: local path or s3://bucket/prefix, Parquet or JSON Lines")
    parser.add_argument("--attributes", required=True, help="JSON or YAML: category -> [attribute, ...] or {attribute: description}")
    parser.add_argument("--output", required=True, help="local path or s3://bucket/prefix for attributes/, rejected/, _report.*")
    parser.add_argument("--model", help="'default' (SmolLM2-135M-Instruct + the shipped HPD adapter), 'default-base' (without it), "
                        "a hub id, a local directory or .gguf, or s3://bucket/prefix/")
    parser.add_argument("--adapter", help="LoRA adapter directory (local or s3://); replaces the shipped one of 'default'")
    parser.add_argument("--decoder", choices=DECODER_CHOICES, default="hpd",
                        help="hpd (default), ar (baseline), reference (slow oracle), dry-run (no model)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="model weights and compute (default float32)")
    parser.add_argument("--docs-per-prompt", type=int, metavar="J", help="products of one category per prompt")
    parser.add_argument("--max-value-tokens", type=int, metavar="K", help="longest value in tokens (K_max)")
    parser.add_argument("--skeleton", choices=SKELETONS,
                        help="where HPD's keys go: after-products or interleaved (as the model was fine-tuned)")
    parser.add_argument("--price-per-gpu-hour", type=float, metavar="USD", help="for the report's $ per 1k products")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N input rows")
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, a running local cluster, or a new one; "
                        "'local' always starts a new one)")
    parser.add_argument("--skip-existing", metavar="OUTPUT_URI",
                        help="skip products already in this earlier output (attributes/ or rejected/)")
    parser.add_argument("--oversize", choices=("truncate", "reject"), help="records over --max-text-chars")
    parser.add_argument("--max-text-chars", type=int, help="title + description + features, in characters")
    parser.add_argument("--chunk-rows", type=int, help="rows per chunk (the unit of work, commit and resume)")
    parser.add_argument("--max-actors", type=int, help="cap on extract actors (default: one per GPU)")
    parser.add_argument("--dry-run-seconds-per-prompt", type=float, metavar="S",
                        help="dry-run decoder only: simulated decode time per prompt")


def check_model_paths(model_uri: str, adapter_uri: str | None) -> None:
    """Local model/adapter paths that are not there fail here, before Ray starts (S3 is checked by the actors)."""
    from hpd_core.config import DEFAULT_MODEL, ModelConfig
    from hpd_core.models import check_paths

    def local(uri: str | None) -> str | None:
        return None if uri is None or uri.startswith("s3://") else uri

    check_paths(ModelConfig(name=local(model_uri) or DEFAULT_MODEL, adapter=local(adapter_uri)))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from jobs.config import from_args
    from pipelines.dryrun import DRY_RUN

    config = from_args(args)  # user errors (ValueError, OSError) are reported by jobs.cli
    if config.extract.decoder != DRY_RUN:
        check_model_paths(config.extract.model_uri, config.extract.adapter_uri)
    if config.extract.decoder != DRY_RUN and importlib.util.find_spec("hpd_core.decoders") is None:
        print("hpd extract: error: the engine's decoders (hpd_core.decoders) are not installed; "
              "use --decoder dry-run to test the pipeline", file=sys.stderr)
        return 2

    import ray

    from pipelines.build import run_job

    if not ray.is_initialized():
        ray.init(address=config.address)
    report = run_job(
        prepare=config.prepare,
        extract=config.extract,
        output=config.output,
        report=config.report,
        resources=config.resources,
        skip_existing=config.skip_existing,
        arguments=config.arguments,
    )
    print(
        f"run {report['run_id']}: {report['rows_in']} rows in, {report['products_out']} products out, "
        f"{report['rows_rejected']} rejected, {report['rows_skipped']} skipped; "
        f"{report['wall_seconds']} s; report: {config.output.uri}/_report.md"
    )
    return 0
