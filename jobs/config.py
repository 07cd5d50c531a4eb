"""The extraction job's configuration: built once from the command line, validated once.

Each stage gets only its own part (PrepareConfig, ExtractConfig, OutputConfig, ReportConfig,
ResourceConfig); the engine part reuses hpd_core's DecodeConfig (and ModelConfig, built per actor).
Defaults live in those dataclasses; an option left out on the command line keeps them.

The run id is a hash of everything that decides the output rows (input, attribute schema, output,
limits, chunking, decoder, model, J, K_max ...), so running again with the same arguments resumes
the same run, and different arguments into the same output are refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass

from hpd_core.config import DecodeConfig
from pipelines.build import ResourceConfig
from pipelines.commit import OutputConfig
from pipelines.dryrun import DryRunConfig
from pipelines.extract_stage import ExtractConfig
from pipelines.io import filesystem, to_uri
from pipelines.reader import ReadConfig
from pipelines.prepare import PrepareConfig
from pipelines.report import ReportConfig
from pipelines.schema import ValidationConfig, load_schema
from pipelines.stacking import StackingConfig


@dataclass(frozen=True)
class JobConfig:
    prepare: PrepareConfig
    extract: ExtractConfig
    output: OutputConfig
    report: ReportConfig
    resources: ResourceConfig
    skip_existing: str | None
    address: str | None
    arguments: dict  # what defines the run (hashed into run_id), recorded in _job.json


def _given(**values) -> dict:
    """Only the options given on the command line: the others keep the dataclass defaults."""
    return {name: value for name, value in values.items() if value is not None}


def _normalise(uri: str) -> str:
    fs, path = filesystem(uri)
    return to_uri(fs, path)


def _nested(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def run_id_for(arguments: dict) -> str:
    return hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:16]


def from_args(args: argparse.Namespace) -> JobConfig:
    """Build and validate the whole configuration; raises ValueError with a message for the user."""
    input_uri, output_uri = _normalise(args.input), _normalise(args.output)
    skip_existing = _normalise(args.skip_existing) if args.skip_existing else None
    if _nested(output_uri, input_uri) or _nested(input_uri, output_uri):
        raise ValueError(f"--output {output_uri} and --input {input_uri} must not contain one another")
    if skip_existing is not None and _nested(skip_existing, output_uri):
        raise ValueError("--skip-existing must name earlier outputs (or a prefix holding them), not this run's output")
    schema = load_schema(args.attributes)
    read = ReadConfig(uri=input_uri, **_given(limit=args.limit, chunk_rows=args.chunk_rows))
    validation = ValidationConfig(**_given(max_text_chars=args.max_text_chars, oversize=args.oversize))
    stacking = StackingConfig(**_given(docs_per_prompt=args.docs_per_prompt))
    decode = DecodeConfig(**_given(max_value_tokens=args.max_value_tokens, skeleton=args.skeleton))
    model = _given(model_uri=args.model, adapter_uri=args.adapter, dtype=args.dtype)
    arguments = {
        "input": input_uri,
        "attributes": hashlib.sha256(schema.to_json().encode()).hexdigest(),
        "output": output_uri,
        "skip_existing": skip_existing,
        "read": {k: v for k, v in asdict(read).items() if k != "uri"},
        "validation": asdict(validation),
        "stacking": asdict(stacking),
        "decoder": args.decoder,
        "model": model,
        "decode": asdict(decode),
    }
    run_id = run_id_for(arguments)
    extract = ExtractConfig(
        decoder=args.decoder,
        schema=schema,
        run_id=run_id,
        decode=decode,
        dry_run=DryRunConfig(**_given(seconds_per_prompt=args.dry_run_seconds_per_prompt)),
        **model,
    )
    return JobConfig(
        prepare=PrepareConfig(read, validation, stacking, schema, output_uri, skip_existing is not None),
        extract=extract,
        output=OutputConfig(output_uri, run_id),
        report=ReportConfig(**_given(price_per_gpu_hour=args.price_per_gpu_hour)),
        resources=ResourceConfig(**_given(max_actors=args.max_actors)),
        skip_existing=skip_existing,
        address=args.address,
        arguments=arguments,
    )
