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
import os
import re
from dataclasses import asdict, dataclass, replace

from hpd_core.config import DecodeConfig
from pipelines.build import ResourceConfig
from pipelines.commit import OutputConfig
from pipelines.dryrun import DRY_RUN, DryRunConfig, parse_failure
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
    # the run ids this same job had before 2026-11-29, with the group_chunks each was read with: a
    # typed default (--model default, --dtype auto) was part of the identity, and chunks were
    # consecutive rows (group_chunks 1); an output started then resumes under its own id, as read then
    former_runs: tuple[tuple[str, int], ...] = ()

    @property
    def former_run_ids(self) -> tuple[str, ...]:
        return tuple(run_id for run_id, _ in self.former_runs)

    def as_run(self, run_id: str) -> JobConfig:
        """This job under ``run_id`` (one of ``former_runs``: the id its output was started with),
        its input cut into chunks as it was then."""
        group = dict(self.former_runs).get(run_id, self.prepare.read.group_chunks)
        read = replace(self.prepare.read, group_chunks=group)
        return replace(self, prepare=replace(self.prepare, read=read), extract=replace(self.extract, run_id=run_id),
                       output=replace(self.output, run_id=run_id))


MODEL_DEFAULTS = {"model_uri": ExtractConfig.model_uri, "dtype": ExtractConfig.dtype}


def _given(**values) -> dict:
    """Only the options given on the command line: the others keep the dataclass defaults."""
    return {name: value for name, value in values.items() if value is not None}


def _normalise(uri: str) -> str:
    fs, path = filesystem(uri)
    return to_uri(fs, path)


def local_adapter(uri: str | None) -> str | None:
    """A local adapter directory by its absolute path, as --input and --output are (another spelling
    of the same directory, or another working directory, is the same job); an S3 URI or a hub id as
    given."""
    if uri is None or "://" in uri:
        return uri
    path = os.path.expanduser(uri)
    if os.path.exists(path) or os.path.isabs(path) or uri.startswith((".", "~")):
        return os.path.abspath(path)
    return uri


def _nested(inner: str, outer: str) -> bool:
    inner, outer = _real(inner), _real(outer)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _real(uri: str) -> str:
    """A local path with its symbolic links resolved (for the nesting checks only: a run's identity
    keeps the path as given)."""
    return uri if "://" in uri else os.path.realpath(uri)


SPEED_ONLY = ("batch_token_budget", "prefill_tokens", "cuda_graphs", "cudnn_attention", "compile_layers")  # DecodeConfig fields left out of a run's identity


def typed_adapter(arguments: dict, adapter: str) -> dict:
    """``arguments`` with the adapter as typed: how a job begun before 2026-11-30 knew it."""
    return {**arguments, "model": {**arguments["model"], "adapter_uri": adapter}}


def run_id_for(arguments: dict) -> str:
    return hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:16]


# config fields whose flag is not --<field with dashes>
FIELD_FLAGS = {"seconds_per_prompt": "--dry-run-seconds-per-prompt", "failures": "--dry-run-fail",
               "dry_run_failures": "--dry-run-fail",
               "model_uri": "--model", "adapter_uri": "--adapter", "uri": "--input"}


def flag_for(field: str, args: argparse.Namespace) -> str | None:
    """The command-line flag that sets a config field (None if no flag does)."""
    if field in FIELD_FLAGS:
        return FIELD_FLAGS[field]
    return "--" + field.replace("_", "-") if field in vars(args) else None


def _with_flags(message: str, args: argparse.Namespace) -> str:
    """A config error names the flag the user typed, not the dataclass field: "docs_per_prompt must
    be ..." -> "--docs-per-prompt must be ..."."""
    def flag(match: re.Match) -> str:
        return flag_for(match[1], args) or match[1]

    return re.sub(r"\b([a-z][a-z_]*)(?= must\b)", flag, message)


def from_args(args: argparse.Namespace) -> JobConfig:
    """Build and validate the whole configuration; raises ValueError with a message for the user
    that names the flags to change."""
    try:
        return _from_args(args)
    except ValueError as err:
        raise ValueError(_with_flags(str(err), args)) from err


def _from_args(args: argparse.Namespace) -> JobConfig:
    input_uri, output_uri = _normalise(args.input), _normalise(args.output)
    skip_existing = _normalise(args.skip_existing) if args.skip_existing else None
    if _nested(output_uri, input_uri) or _nested(input_uri, output_uri):
        raise ValueError(f"--output {output_uri} and --input {input_uri} must not contain one another")
    if skip_existing is not None and _nested(skip_existing, output_uri):
        raise ValueError("--skip-existing must name earlier outputs (or a prefix holding them), not this run's output")
    schema = load_schema(args.attributes)
    read = ReadConfig(uri=input_uri, **_given(limit=args.limit, chunk_rows=args.chunk_rows, group_chunks=args.group_chunks))
    validation = ValidationConfig(**_given(max_text_chars=args.max_text_chars, oversize=args.oversize))
    stacking = StackingConfig(**_given(docs_per_prompt=args.docs_per_prompt))
    decode = DecodeConfig(**_given(max_value_tokens=args.max_value_tokens, skeleton=args.skeleton,
                                   batch_token_budget=args.batch_token_budget, step_shape=args.step_shape,
                                   compile_layers=args.compile_layers), spans=args.spans,
                          cuda_graphs=args.cuda_graphs, cudnn_attention=args.cudnn_attention, confidence=args.confidence)
    model = _given(model_uri=args.model, adapter_uri=local_adapter(args.adapter), dtype=args.dtype)
    failures = tuple(map(parse_failure, args.dry_run_fail or ()))
    dry_run = DryRunConfig(**_given(seconds_per_prompt=args.dry_run_seconds_per_prompt), failures=failures)
    arguments = {
        "input": input_uri,
        "attributes": schema.digest(),
        "output": output_uri,
        "skip_existing": skip_existing,
        # group_chunks 1 is how every job read its input before the option: left out, the same identity
        "read": {k: v for k, v in asdict(read).items() if k != "uri" and (k, v) != ("group_chunks", 1)},
        "validation": asdict(validation),
        "stacking": asdict(stacking),
        "decoder": args.decoder,
        # as given, less what equals the default: typing --model default or --dtype auto is the same job
        "model": {k: v for k, v in model.items() if v != MODEL_DEFAULTS.get(k)},
        # the batch budget sets speed, not results: a run may resume on another machine with another one
        # confidence off is how every job ran before the option: left out, the same identity
        "decode": {k: v for k, v in asdict(decode).items() if k not in SPEED_ONLY and (k, v) != ("confidence", False)},
        "values_in_text": not args.keep_values_not_in_text,
    }
    if args.decoder == DRY_RUN and dry_run.failures:  # they decide which rows are rejected
        arguments["dry_run_failures"] = [list(failure) for failure in dry_run.failures]
    run_id = run_id_for(arguments)
    ungrouped = {**arguments, "read": {k: v for k, v in arguments["read"].items() if k != "group_chunks"}}
    formers: dict[str, int] = {}  # identities of this job before 2026-11-29 -> how they read their input
    if args.group_chunks in (None, 1):  # then every job read chunks of consecutive rows (group_chunks 1)
        for identity in (ungrouped, {**ungrouped, "model": model}):  # and a typed default was part of it
            formers.setdefault(run_id_for(identity), 1)
            if "adapter_uri" in model and model["adapter_uri"] != args.adapter:  # and the adapter as typed
                formers.setdefault(run_id_for(typed_adapter(identity, args.adapter)), 1)
    formers.pop(run_id, None)
    extract = ExtractConfig(
        decoder=args.decoder,
        schema=schema,
        run_id=run_id,
        decode=decode,
        dry_run=dry_run,
        values_in_text=not args.keep_values_not_in_text,
        **model,
    )
    return JobConfig(
        prepare=PrepareConfig(read, validation, stacking, schema, output_uri, skip_existing is not None),
        extract=extract,
        output=OutputConfig(output_uri, run_id),
        report=ReportConfig(**_given(price_per_hour=args.price_per_hour)),
        resources=ResourceConfig(**_given(max_actors=args.max_actors, actor_restarts=args.actor_restarts),
                                 device=args.device),
        skip_existing=skip_existing,
        address=args.address,
        arguments=arguments,
        former_runs=tuple(formers.items()),
    )
