"""Every check of `hpd extract` that can be made before Ray starts, and before anything is written.

- the input: exists, holds data files; whether it holds any row at all (an empty input is a job of
  0 products, finished without Ray and without a model);
- the model and adapter: an embedded model, a local path that exists, an ``s3://`` prefix that
  exists, or a hub id already in the local Hugging Face cache (nothing is downloaded at run time,
  so a mistyped name fails here in one line, not in the actors);
- the output: empty, or the same job (a resume, or a finished job: nothing to do), or, with
  ``--overwrite``, any earlier job; a different job is refused with the arguments that differ.

User errors raise ValueError / OSError, which ``hpd`` prints as one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpd_core import prompts
from jobs.config import JobConfig, flag_for, typed_adapter
from pipelines import commit, io, reader
from pipelines.dryrun import DRY_RUN


MODEL_FILES = "model_files"  # in _job.json's arguments, outside the run id
INPUT_MODIFIED = "input_modified"  # likewise: the digest of the input files' modification times
PROMPT_FORMAT = "prompt_format"  # likewise: hpd_core.prompts.PROMPT_FORMAT of the version that started the job
NOT_ARGUMENTS = (MODEL_FILES, INPUT_MODIFIED, PROMPT_FORMAT)  # in _job.json's arguments, but no flag sets them
UNRECORDED_FORMATS = (1, 2)  # what a job begun 2026-11-29 18:00 - 2026-11-30 02:10 may have prompted with


@dataclass(frozen=True)
class Preflight:
    """What the checks found: what the run has to do."""

    shards: tuple[reader.Shard, ...]
    empty: bool  # the input holds no row
    existing_run: str | None  # run id of the job already in the output
    complete: bool  # the same job is already finished (its report exists): nothing to do
    arguments: dict  # the job's arguments and what its model and adapter are (``model_files``), for _job.json
    run_id: str  # the job's run id (the output's own where it was started under a former one)
    ignored: tuple[str, ...] = ()  # data files of the input not read for their names (_ or . first)
    input_modified: bool = False  # the same job, and its input files' modification times differ since it started
    # the output holds what a stopped deletion left: only attempt records (``existing_run`` None,
    # commit.leftovers_only), or an unfinished job of packed files (commit.deletion_stopped)
    leftovers: bool = False
    unsupported: tuple[str, ...] = ()  # files of no type the reader reads, beside data files: a rejected row each
    nothing_to_skip: bool = False  # --skip-existing names a prefix that holds no earlier output


def hub_cache() -> Path:
    from huggingface_hub import constants  # light: no torch, no transformers

    return Path(constants.HF_HUB_CACHE)


def in_hub_cache(repo_id: str) -> bool:
    snapshots = hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def _looks_local(name: str) -> bool:
    return os.path.exists(name) or os.path.isabs(name) or name.startswith((".", "~")) or name.endswith(".gguf")


def check_model(model_uri: str, adapter_uri: str | None) -> None:
    """Fail on a model or adapter that the actors could not load (see the module doc)."""
    from hpd_core.config import ModelConfig
    from hpd_core.models import EMBEDDED, check_adapter_path, check_paths

    for flag, uri in (("--model", model_uri), ("--adapter", adapter_uri)):
        if uri and uri.startswith("s3://") and not io.list_files(uri) and not io.exists(uri):
            raise ValueError(f"{flag} {uri}: nothing there (an S3 prefix holding the files, or one object)")
    local = [None if uri is None or uri.startswith("s3://") else uri for uri in (model_uri, adapter_uri)]
    if local[0] is not None:  # local paths exist? (a model from S3 needs no embedded model's package)
        check_paths(ModelConfig(name=local[0], adapter=local[1]))
    else:
        check_adapter_path(local[1])
    for flag, name in (("--model", local[0]), ("--adapter", local[1])):
        if name is None or name in EMBEDDED or _looks_local(name) or in_hub_cache(name):
            continue
        embedded = ", ".join(EMBEDDED) if flag == "--model" else "none"
        raise ValueError(
            f"{flag} {name!r} is not an embedded model ({embedded}), not a local path, and not in the local "
            f"Hugging Face cache ({hub_cache()}); nothing is downloaded at run time: check the name, or give a "
            "local directory, a .gguf file or an s3:// prefix"
        )


def files_fingerprint(path: Path) -> str:
    """A hash of a local model or adapter (a file, or a folder's files): their names, sizes and the
    content of their first and last MiB. Another file, a retrained one, or one changed in place
    gives another; a copy elsewhere, the same."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"|{file.relative_to(path) if path.is_dir() else file.name}|{size}|".encode())
        with open(file, "rb") as handle:
            digest.update(handle.read(1 << 20))
            if size > 2 << 20:
                handle.seek(-(1 << 20), os.SEEK_END)
                digest.update(handle.read())
    return digest.hexdigest()


def model_files(model_uri: str, adapter_uri: str | None) -> dict:
    """What the job's model and adapter are, file by file (``files_fingerprint``; S3: its listing;
    an embedded model: its package's GGUF file and shipped adapter; a hub id: the cached revision),
    kept in the output's ``_job.json``: a job resumed with a model or adapter changed under the same
    name would write two models' values into one output (``preflight`` refuses it)."""
    from hpd_core.models import EMBEDDED

    from pipelines.artifacts import s3_fingerprint

    def one(uri: str | None) -> str | None:
        if uri is None:
            return None
        if uri.startswith("s3://"):
            return "s3:" + s3_fingerprint(uri)
        if uri in EMBEDDED:
            embedded = EMBEDDED[uri]
            adapter = files_fingerprint(embedded.adapter) if embedded.adapter is not None else None
            return f"embedded:{embedded.package}/{embedded.gguf_file}:{adapter}"
        local = Path(uri).expanduser()
        if local.exists():
            return "files:" + files_fingerprint(local)
        refs = hub_cache() / f"models--{uri.replace('/', '--')}" / "refs" / "main"
        return "hub:" + (refs.read_text().strip() if refs.is_file() else uri)

    return {"model": one(model_uri), "adapter": one(adapter_uri)}


def _show(value: object) -> str:
    if value is None:
        return "not given"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _group_chunks_shown(arguments: dict) -> dict:
    """``arguments`` with ``read.group_chunks`` 1 put back: the identity leaves 1 out (jobs.config),
    and a message saying "not given" of a typed ``--group-chunks 1`` would be wrong (8 is the default)."""
    read = arguments.get("read")
    if isinstance(read, dict) and "group_chunks" not in read:
        return {**arguments, "read": {**read, "group_chunks": 1}}
    return arguments


def conflict_message(output: str, existing: dict, arguments: dict, args: argparse.Namespace) -> str:
    """Which arguments differ between the job in ``output`` and this one, by flag."""
    parts = []
    there, here = (_group_chunks_shown(a) for a in (existing.get("arguments") or {}, arguments))
    for key, old, new in commit.differences(there, here):
        if key.split(".", 1)[0] in NOT_ARGUMENTS:
            continue
        name = flag_for(key.rsplit(".", 1)[-1], args) or key
        if key == "attributes":
            parts.append("--attributes (the schema's content)")
        else:
            parts.append(f"{name} (there: {_show(old)}; here: {_show(new)})")
    differing = "; ".join(parts) or "the arguments of an older version of hpd extract"
    return (f"--output {output} holds another job (run {existing.get('run_id')}); it differs in {differing}. "
            "Use the same arguments to resume it, a new --output, or --overwrite to delete it and start over")


def check_input_files(shards: list[reader.Shard], input_uri: str, attributes: str | None) -> None:
    """The input's files to read are records: not the ``--attributes`` file (a folder --input that
    holds it), nor the labels of a labelled folder (``hpd convert``'s and ``hpd pick``'s layout),
    whose lines would be rejected one by one, and would use up ``--limit``."""
    from datafiles.dataset import GOLD_DRAFT_FILE, GOLD_FILE, RECORDS_FILE

    def real(uri: str) -> str:  # a local file by its real path: a link to the schema is the schema
        return uri if "://" in uri else os.path.realpath(uri)

    uris = {shard.uri for shard in shards}
    if attributes is not None:
        if real(attributes) in {real(uri) for uri in uris}:
            raise ValueError(f"--attributes {attributes} lies inside --input {input_uri}, whose files are all read as "
                             "records: give --input the records' file (or a folder of records only), or move the schema out")
    labels = sorted(uri for uri in uris if uri.rsplit("/", 1)[-1] in (GOLD_FILE, GOLD_DRAFT_FILE))
    if labels:
        folder = labels[0].rsplit("/", 1)[0]
        raise ValueError(f"--input {input_uri} holds labels ({labels[0]}), which would be read as records: give --input "
                         f"the records' file ({folder}/{RECORDS_FILE}), or a folder of records only")


def preflight(config: JobConfig, args: argparse.Namespace) -> Preflight:
    """Run every check; write nothing. ``args.overwrite`` allows replacing an earlier job."""
    plan = reader.plan_input(config.prepare.read)  # the input exists and holds data files
    check_input_files(plan.shards, config.prepare.read.uri, getattr(args, "attributes", None))
    reader.check_format(plan.shards, config.prepare.read)  # a JSON array, a Parquet file without a title column, ...
    shards = tuple(plan.shards)
    arguments = {**config.arguments, INPUT_MODIFIED: plan.modified}
    if config.extract.decoder != DRY_RUN:
        check_model(config.extract.model_uri, config.extract.adapter_uri)
        arguments = {**arguments, MODEL_FILES: model_files(config.extract.model_uri, config.extract.adapter_uri),
                     PROMPT_FORMAT: prompts.PROMPT_FORMAT}
    output = config.output.uri
    if output.startswith("s3://") and not io.exists("s3://" + output[len("s3://"):].split("/", 1)[0]):
        raise ValueError(f"--output {output}: the bucket does not exist (or these credentials cannot see it)")
    if "://" not in output and os.path.exists(output) and not os.path.isdir(output):
        raise ValueError(f"--output {output} is a file: give a folder (new or empty, or this job's)")
    existing, has_files = commit.existing_job(output)
    leftovers = has_files and existing is None and commit.leftovers_only(output)
    if has_files and existing is None and not leftovers:
        raise ValueError(f"--output {output} holds files that are not an hpd extract output; give a new or empty folder")
    run_id = config.output.run_id
    if existing is not None and existing.get("run_id") in config.former_run_ids and not args.overwrite:
        run_id = existing["run_id"]  # the same job, started by an earlier version: resumed under its id
    elif existing is not None and not args.overwrite and same_adapter_as_typed(existing, arguments, config.arguments):
        run_id = existing["run_id"]  # the same job, begun with the adapter's path as typed
    same = existing is not None and existing.get("run_id") == run_id
    if existing is not None and not same and not args.overwrite:
        raise ValueError(conflict_message(output, existing, config.arguments, args))
    if same and not args.overwrite:
        before = (existing.get("arguments") or {}).get(MODEL_FILES) or {}  # none in jobs before 2026-11-29
        changed = [k for k, v in before.items() if v != arguments.get(MODEL_FILES, {}).get(k)]
        if changed:  # the same names, other files: resuming would mix two models' values
            names = {"model": config.extract.model_uri, "adapter": config.extract.adapter_uri}
            flags = " and ".join(f"--{k} {names[k]}" for k in changed)
            raise ValueError(f"{flags} changed since the job in --output {output} started (other files under the same "
                             "name); resuming would write two models' values into one output: use a new --output, "
                             "or --overwrite to start it over")
    empty = not reader.has_rows(list(shards), config.prepare.read)
    complete = False
    if same and not args.overwrite and io.exists(io.join(output, "_report.json")):
        state = commit.scan(output)
        complete = empty or all(state.complete(shard.shard_id) for shard in shards)
    resumed = same and not args.overwrite and not complete
    if resumed and commit.deletion_stopped(output):  # deleted under a lease and run anew, as --overwrite would
        resumed, leftovers = False, True
    if resumed and empty:  # its id index was built on rows: an empty input now is a changed one, not a finished job
        raise ValueError(f"--input {config.prepare.read.uri} holds no rows now, but the unfinished job in --output "
                         f"{output} began on rows: the input changed since it started; {commit.START_OVER}")
    if resumed:  # a finished job is only reported, whoever finished it
        check_prompt_format(existing, arguments, output)
        commit.check_open(output)
    # a file rewritten in place to the same size keeps its shards (a size that changed is refused
    # when the job's id index is read); its modification time is the first sign, and copying or
    # touching a file changes it too, so this is a warning (none for jobs from before the digest);
    # the prepare stage refuses a chunk whose rows no longer read as the id index says
    modified = same and not args.overwrite and (existing.get("arguments") or {}).get(INPUT_MODIFIED, plan.modified) != plan.modified
    return Preflight(shards, empty, existing.get("run_id") if existing else None, complete, arguments, run_id,
                     tuple(plan.ignored), modified, leftovers, plan.unsupported, nothing_to_skip(config))


def nothing_to_skip(config: JobConfig) -> bool:
    """``--skip-existing`` names a prefix with no earlier output under it (this job's own aside): the
    first night of a backfill, or a mistyped path, which would run the whole catalog again."""
    if config.skip_existing is None:
        return False
    from pipelines.idindex import earlier_outputs

    return not earlier_outputs(config.skip_existing, config.output.uri)


def same_adapter_as_typed(existing: dict, arguments: dict, here: dict) -> bool:
    """Whether the job in the output (its ``_job.json``) is this one with its adapter recorded as
    typed, relative (before 2026-11-30, a local --adapter was not made absolute): every other
    argument the same, and the recorded path names this adapter from here, or its recorded files
    are this adapter's (the job begun from another working directory)."""
    recorded = existing.get("arguments") or {}
    there = (recorded.get("model") or {}).get("adapter_uri")
    ours = here["model"].get("adapter_uri")
    if there is None or ours is None or there == ours or "://" in there or os.path.isabs(there):
        return False
    if {k: v for k, v in recorded.items() if k not in NOT_ARGUMENTS} != json.loads(json.dumps(typed_adapter(here, there))):
        return False
    files = (recorded.get(MODEL_FILES) or {}).get("adapter")
    return (os.path.abspath(os.path.expanduser(there)) == ours
            or (files is not None and files == arguments.get(MODEL_FILES, {}).get("adapter")))


def recorded_prompt_format(existing: dict) -> int | None:
    """The prompt format of the job in ``existing`` (its ``_job.json``): as recorded since
    2026-11-30; else 1 (the title first) for a job whose arguments lack ``input_modified``
    (recorded since 2026-11-29 18:00, before the title went last at 23:24; jobs resumed under a
    former run id are older still); None (1 or 2, not known which) for one started in between."""
    recorded = existing.get("arguments") or {}
    if PROMPT_FORMAT in recorded:
        return recorded[PROMPT_FORMAT]
    return None if INPUT_MODIFIED in recorded else 1


def check_prompt_format(existing: dict, arguments: dict, output: str) -> None:
    """A job is resumed only by a version that prompts as the one that started it (see
    ``hpd_core.prompts.PROMPT_FORMAT``); a job whose format was not recorded prompted with 1 or 2,
    and is refused by a version of a later format."""
    before = recorded_prompt_format(existing)
    now = arguments.get(PROMPT_FORMAT)
    if now is not None and (before != now if before is not None else now > UNRECORDED_FORMATS[-1]):
        shown = before if before is not None else " or ".join(map(str, UNRECORDED_FORMATS)) + " (not recorded)"
        raise ValueError(f"the job in --output {output} was started by another version of hpd extract, which prompts "
                         f"the model otherwise (prompt format {shown}; this version's: {now}); resuming would write "
                         "values of two prompts into one output: finish it with the version that started it, use a "
                         "new --output, or --overwrite to start it over")
