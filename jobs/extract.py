"""`hpd extract`: run the extraction job (DESIGN.md section 1) on Ray Data.

Every argument and input is checked before Ray starts and before anything is written
(jobs/checks.py). An input without rows finishes at once (0 products, no Ray, no model); a finished
job is not run again. Locally (no --address, no running cluster) it starts a Ray instance sized to
the machine; under `ray job submit` it joins the job's cluster. Run it again with the same
arguments to resume; --overwrite deletes an earlier job in the output and starts over. A job whose
every row was rejected exits with status 1 (its rejected rows and report are written).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time

from hpd_core.config import COMPILE_LAYERS, DEFAULT_MODEL, SKELETONS, SPANS, STEP_SHAPES, DecodeConfig, ModelConfig
from jobs import CommandFailed, stop_cleanly_on_sigterm
from pipelines.devices import DEFAULT_DEVICE, DEVICES
from pipelines.dryrun import FAILURE_MODES, DryRunConfig
from pipelines.reader import UNDERSTOOD, ReadConfig
from pipelines.report import CPU_PRICE_PER_HOUR, GPU_PRICE_PER_HOUR
from pipelines.schema import OVERSIZE_POLICIES, ValidationConfig
from pipelines.stacking import StackingConfig

DECODER_CHOICES = ("hpd", "ar", "reference", "dry-run")  # pipelines.extract_stage.EXTRACT_DECODERS
INTERRUPTED = "run the same command again to resume (the chunks committed so far, if any, are kept)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Defaults shown in --help are read from the config dataclasses (where they live)."""
    parser.add_argument("--input", required=True, help="records: local path or s3://bucket/prefix, Parquet or JSON Lines")
    parser.add_argument("--attributes", required=True, help="JSON or YAML: category -> [attribute, ...] or {attribute: description}")
    parser.add_argument("--output", required=True, help="local path or s3://bucket/prefix for attributes/, rejected/, _report.*")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the job already in --output (its values, rejected rows and report) and start over; "
                        "without it a different job there is refused and the same job resumes")
    parser.add_argument("--model", help=f"'{DEFAULT_MODEL}' (Gemma 3 270M base + the shipped HPD adapter), 'default-base' "
                        "(without it; also 'gemma3-270m'), 'smollm2-135m-hpd' (SmolLM2-135M + its HPD adapter), "
                        "'smollm2-135m', a local directory or .gguf, s3://bucket/prefix/, or a hub id "
                        f"already in the local Hugging Face cache (default: {DEFAULT_MODEL})")
    parser.add_argument("--adapter", help="LoRA adapter directory (local or s3://); replaces the shipped one of 'default' (default: none)")
    parser.add_argument("--decoder", choices=DECODER_CHOICES, default="hpd",
                        help="hpd, ar (baseline), reference (slow oracle), dry-run (no model) (default: hpd)")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"),
                        help="model weights and compute; auto: bfloat16 on GPUs and on CPUs with AVX-512 BF16 or AMX, "
                        "float32 on other CPUs (default: auto)")
    parser.add_argument("--docs-per-prompt", type=int, metavar="J",
                        help=f"products of one category per prompt (default: {StackingConfig.docs_per_prompt})")
    parser.add_argument("--max-value-tokens", type=int, metavar="K",
                        help=f"longest value in tokens, K_max (default: {DecodeConfig.max_value_tokens})")
    parser.add_argument("--skeleton", choices=SKELETONS,
                        help="where HPD's keys go: after-products or interleaved, as the model was fine-tuned "
                        f"(default: {DecodeConfig.skeleton})")
    parser.add_argument("--batch-token-budget", type=int, metavar="TOKENS",
                        help="most cache entries (rows x row length) one batch of an actor may reach; changes speed, not "
                        "results (default: 0, sized for the device: 65536 on a CPU, half the free memory on a GPU)")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=DecodeConfig.cuda_graphs,
                        help="on a GPU, record each batch's fixed-shape decode step once as a CUDA graph and replay it "
                        "(greedy, without span decoding); changes speed, not results (default: on; --no-cuda-graphs: eager steps)")
    parser.add_argument("--step-shape", choices=STEP_SHAPES,
                        help="how decode steps are laid out: packed (only the values still open are computed), fixed (every "
                        "slot every step, the same shapes: CUDA graphs), auto (packed on a CPU; on a GPU fixed, except HPD "
                        "batches of heavy steps); the same tokens in float32 (default: auto)")
    parser.add_argument("--cudnn-attention", action=argparse.BooleanOptionalAction, default=DecodeConfig.cudnn_attention,
                        help="let attention use cuDNN's kernels on a GPU; off by default: cuDNN builds a plan for every new "
                        "attention shape and the engine's shapes change with every batch; changes speed (in bf16 also the rounding)")
    parser.add_argument("--compile-layers", choices=COMPILE_LAYERS,
                        help="run each layer's MLP, norms and rotary embedding through torch.compile: on, off, auto (on a GPU for models of "
                        "1B+ body parameters; on a CPU in bf16, the element-wise work alone; compiling takes seconds once per "
                        "actor); changes speed (in bf16 also the rounding) (default: auto)")
    parser.add_argument("--spans", nargs="?", const="on", default="auto", choices=SPANS,
                        help="hpd, ar, reference: decode each value as a span of its product's text (tokens that would leave it are "
                        "never chosen; the LM head runs over the allowed tokens only): on (also --spans alone), off, or auto "
                        "(default: on where the model runs on a CPU, where it is faster and scores the same; off on a GPU)")
    parser.add_argument("--confidence", action="store_true",
                        help="hpd, reference: write each value's probability under the model in a confidence column "
                        "(null for a value written as null by the text check; not with --decoder ar)")
    parser.add_argument("--keep-values-not-in-text", action="store_true",
                        help="write values that do not occur in their product's text as the model gave them "
                        "(default: write them as null and count them in the report's values_not_in_text)")
    parser.add_argument("--price-per-hour", type=float, metavar="USD",
                        help=f"price per device-hour for the report's $ per 1k products (default: ${GPU_PRICE_PER_HOUR} "
                        f"per GPU-hour on GPUs, ${CPU_PRICE_PER_HOUR} per vCPU-hour on CPUs; see the README)")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N input rows (default: all)")
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, a running local cluster, or a new one; "
                        "'local' always starts a new one)")
    parser.add_argument("--skip-existing", metavar="OUTPUT_URI",
                        help="skip products already in this earlier output (attributes/ or rejected/), or in any output "
                        "under this prefix (default: none)")
    parser.add_argument("--oversize", choices=OVERSIZE_POLICIES,
                        help=f"records over --max-text-chars (default: {ValidationConfig.oversize})")
    parser.add_argument("--max-text-chars", type=int,
                        help=f"title + description + features, in characters (default: {ValidationConfig.max_text_chars})")
    parser.add_argument("--chunk-rows", type=int,
                        help=f"rows per chunk, the unit of work, commit and resume (default: {ReadConfig.chunk_rows})")
    parser.add_argument("--group-chunks", type=int, metavar="G",
                        help="rows are grouped by category over windows of G chunks before they are cut into chunks, "
                        "so that prompts (one category of one chunk each) fill where the input mixes categories "
                        f"(default: {ReadConfig.group_chunks}; 1: chunks of consecutive rows)")
    parser.add_argument("--max-actors", type=int, help="cap on extract actors (default: one per GPU, or what the CPUs allow); "
                        "with --device gpu, the GPUs to ask an autoscaling cluster for (default 1)")
    parser.add_argument("--device", choices=DEVICES, default=DEFAULT_DEVICE,
                        help="where the extract actors run: auto (the GPUs the cluster has at the start, else its CPUs), "
                        "gpu (one GPU per actor, waiting for an autoscaling cluster to start them), or cpu (default: auto)")
    parser.add_argument("--actor-restarts", type=int, metavar="N",
                        help="times an extract actor whose process died (lost node, out of memory, crash) is started "
                        "again before the job stops with the cause (default: 3)")
    parser.add_argument("--verbose", action="store_true",
                        help="also show Ray's logs and progress bars and the workers' output (default: only this job's "
                        "progress line, warnings and summary)")
    parser.add_argument("--dry-run-seconds-per-prompt", type=float, metavar="S",
                        help=f"dry-run decoder only: simulated decode time per prompt (default: {DryRunConfig.seconds_per_prompt})")
    parser.add_argument("--dry-run-fail", action="append", metavar="[MODE:]PRODUCT_ID",
                        help=f"dry-run decoder only, repeatable: prompts holding this product fail; MODE {'|'.join(FAILURE_MODES)} "
                        "(default raise: every time; flaky: the first time; error: reported by the engine; "
                        "crash: the actor's process exits, as when it is killed for memory; broken: every call "
                        "fails from the first that holds it, as a broken decoder would)")


FILL_WARNING_PROMPTS = 100  # fewer prompts: a small job, whose categories may hold fewer than J products each


def fill_warning(report: dict) -> str | None:
    """A warning when prompts held under half of J products on average in a job of many prompts: a
    prompt stacks products of one category from one chunk, so an input whose categories are mixed
    row by row fills few, and HPD's cost per product grows with every empty place."""
    fill, docs = report.get("products_per_prompt"), report.get("docs_per_prompt") or 1
    if fill is None or docs < 2 or report.get("prompts", 0) < FILL_WARNING_PROMPTS or fill >= docs / 2:
        return None
    return (f"warning: prompts held {fill} products on average against J = {docs}: a prompt stacks products of one "
            "category from one chunk, and the rows of a window of --group-chunks chunks are grouped by category; where "
            "the input mixes many categories, sort or partition it by category (or raise --group-chunks) to fill them")


def window_warning(report: dict) -> str:
    """Values decoded where the model's sliding-window layers see none of their product's text."""
    return (f"warning: {report['values_beyond_window']} of {report['attribute_rows']} values were decoded a sliding "
            "window or more positions after their product's text (HPD leaves --max-value-tokens positions after every "
            "key), where most of the model's layers cannot see it; they are mostly null or wrong. With --skeleton "
            "interleaved (the default) such prompts are decoded as groups of their attributes; with after-products "
            "they are not, and a key wider than the window cannot be split (docs/sliding-window.md)")


def category_notes(report: dict, shown: int = 5) -> list[str]:
    """Categories to look at: those whose every value came out null (attribute names the model does
    not read as the records mean them?), and the schema's categories that no product came out in
    (a category the records spell otherwise is rejected; ``hpd rejected`` names it). None for a job
    whose every row was rejected (warned of already), nor for reports without per-category counts."""
    if every_row_rejected(report):
        return []
    def names(items: list[str]) -> str:
        return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")
    notes = []
    table = report.get("by_category") or {}
    if empty := [f"{name} ({row['products']} product{'s' if row['products'] != 1 else ''})"
                 for name, row in table.items() if row["attribute_rows"] and not row["values"]]:
        notes.append(f"note: every value was null in {len(empty)} categor{'ies' if len(empty) != 1 else 'y'}: "
                     f"{names(empty)}; check their attribute names and the products' text (_report.md, by category)")
    if missing := report.get("categories_without_products"):
        notes.append(f"note: {len(missing)} of the schema's categories had no product in this run: {names(missing)} "
                     f"(none among the rows read{' or all skipped' if report.get('skip_existing') else ''}; records "
                     f"that spell a category otherwise are rejected: hpd rejected {report['output']})")
    return notes


def every_row_rejected(report: dict) -> bool:
    """Rows came in and every one was rejected: the job ran, but the likely cause is the input's
    format, its field names or the schema, and a scheduler must not take it for a success (exit 1)."""
    return bool(report["rows_in"]) and report["rows_rejected"] == report["rows_in"]


def _summary(report: dict, output: str) -> str:
    rejected = report["rows_rejected"]
    by_stage = ", ".join(f"{stage} {n}" for stage, n in report["rejected_by_stage"].items())
    lines = [
        f"run {report['run_id']}: {report['rows_in']} rows in, {report['products_out']} products out, "
        f"{rejected} rejected{f' ({by_stage})' if by_stage else ''}, {report['rows_skipped']} skipped; "
        f"{report['wall_seconds']} s"
        + (f" over {report['attempts']} attempts" if report.get("attempts", 1) > 1 else ""),
        f"attribute values: {output}/attributes/   (Parquet, one folder per category"
        f"{'; each value with its confidence' if report.get('confidence') else ''})" if report["products_out"] else
        "attribute values: none",
        f"rejected rows:    {output}/rejected/   (Parquet: record, reason, stage)" if rejected else "rejected rows:    none",
        f"report:           {output}/_report.md and {output}/_report.json",
    ]
    if report.get("inputs_truncated"):
        lines.append(f"{report['inputs_truncated']} product(s) had their text cut to --max-text-chars (--oversize "
                     "truncate): every value of theirs is flagged truncated")
    if every_row_rejected(report):  # a schema whose categories match none, a wrong field name, ...
        lines.append(f"warning: every row was rejected (exit status 1); the reasons, most frequent first: "
                     f"hpd rejected {output}")
    elif set(report["rejected_by_stage"]) - {"extract"}:
        lines.append(f"why they were rejected, by stage and reason: hpd rejected {output}")
    if report["rejected_by_stage"].get("extract"):  # the decoder failed on them: worth another run
        lines.append(f"the {report['rejected_by_stage']['extract']} rejected at extract, to run again: "
                     f"hpd rejected {output} --stage extract --out FILE.jsonl")
    lines += category_notes(report)
    if (warning := fill_warning(report)) is not None:
        lines.append(warning)
    if report.get("values_beyond_window"):
        lines.append(window_warning(report))
    if report.get("cuda_graph_failures"):
        lines.append(f"warning: {report['cuda_graph_failures']} CUDA graph capture(s) failed; those batches ran "
                     "eagerly (the same values, slower); the actors' logs (--verbose) say why")
    return "\n".join(lines)


# A local Ray that the job starts keeps at most this many finished tasks' events in its GCS (the
# dashboard's task list). Ray's default, 100,000, lets the GCS grow by hundreds of MB over a long
# job (a few tasks per chunk). Set the variable to keep more; a joined cluster keeps its own setting.
TASK_EVENTS_ENV = "RAY_task_events_max_num_task_in_gcs"
TASK_EVENTS_KEPT = "10000"


def _run_on_ray(config, args, arguments: dict, overwrite: bool = False) -> dict:
    import ray

    from jobs import nodewatch, quiet
    from pipelines.attempts import LostLeaseError
    from pipelines.build import run_job
    from pipelines.idindex import InputChangedError

    quiet.quiet_ray_data(args.verbose)
    started = time.time()  # the attempt's time (and cost) counts Ray's start: 8-12 s on a 2-core machine
    started_here = not ray.is_initialized()
    if started_here:
        os.environ.setdefault(TASK_EVENTS_ENV, TASK_EVENTS_KEPT)  # read by a GCS that ray.init starts here
        try:
            ray.init(address=config.address, **quiet.ray_init_options(args.verbose))
        except Exception as err:  # ConnectionError, ...; a plain Exception when its node times out at startup
            first_line = (str(err).splitlines() or [""])[0]
            raise CommandFailed(f"could not start or join Ray: {type(err).__name__}: {first_line}") from err
        stop_cleanly_on_sigterm()  # after ray.init, which installs its own SIGTERM handler
    try:
        with (quiet.StderrFilter(active=not args.verbose) as stderr,
              nodewatch.watching(nodewatch.local_node() if started_here else {},
                                 nodewatch.lost_node(stderr.write, INTERRUPTED))):
            return run_job(
                prepare=config.prepare,
                extract=config.extract,
                output=config.output,
                report=config.report,
                resources=config.resources,
                skip_existing=config.skip_existing,
                arguments=arguments,
                overwrite=overwrite,
                started=started,
            )
    except ray.exceptions.RayError as err:  # a task or actor failed for good: its cause, in one line
        line = failure_line(err, config.resources.actor_restarts)
        if line.startswith(f"{InputChangedError.__name__}:"):  # says what to do; running it again fails alike
            raise CommandFailed(line) from err
        if line.startswith(f"{LostLeaseError.__name__}: "):  # a writer found another attempt at work: as the driver says it
            raise LostLeaseError(line[len(LostLeaseError.__name__) + 2:]) from err
        raise CommandFailed(f"{line}; {INTERRUPTED}") from err


MEMORY_ADVICE = ("Out of memory is the usual cause: fewer actors per node (--max-actors), smaller --chunk-rows or "
                 "--docs-per-prompt, or nodes with more memory; Ray's logs (/tmp/ray/session_latest/logs) say more")


def failure_line(err: BaseException, restarts: int) -> str:
    """One line for a job Ray failed: an extract actor that died more often than ``restarts`` allows
    (Ray's exit detail: its whole message holds ids, a pid and a paragraph of advice), a task or actor
    killed for memory, or the innermost cause of anything else."""
    if type(err).__name__ == "ActorDiedError" and not getattr(err, "actor_init_failed", False):
        detail = re.search(r"Worker exit detail: (.+?\.)(?:\s|$)", str(err))
        why = f": {detail[1]}" if detail else "."
        if detail and "Owner's node has crashed" in detail[1]:  # the driver's node: no restart could help
            return f"the Ray node of the job's driver died under an extract actor{why} {MEMORY_ADVICE}"
        return f"an extract actor's process died {restarts + 1} time(s) (--actor-restarts {restarts}){why} {MEMORY_ADVICE}"
    line = root_cause(err)
    if type(err).__name__ == "OutOfMemoryError" or "running low on memory" in line:
        return f"{line} {MEMORY_ADVICE}"
    return line


def root_cause(err: BaseException) -> str:
    """``Type: first line`` of the innermost cause of a Ray error (Ray wraps it, with tracebacks).

    Ray Data raises errors it does not blame on the user's code ``from SystemException()``, an empty
    marker: the error itself is then the cause."""
    cause = err
    while ((inner := getattr(cause, "cause", None) or cause.__cause__) is not None and inner is not cause
           and type(inner).__name__ != "SystemException"):
        cause = inner
    if type(cause).__name__ == "UserCodeException":  # Ray Data's wrapper: the user's error is in its text
        named = [m for m in _ERROR_LINE.findall(str(err)) if m[0] not in ("UserCodeException", "RayTaskError")]
        if named:
            return f"{named[-1][0]}: {named[-1][1]}"
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", re.M)


def run(args: argparse.Namespace) -> int:
    from jobs import quiet
    from jobs.checks import preflight
    from jobs.config import from_args
    from pipelines import commit, io
    from pipelines.dryrun import DRY_RUN
    from pipelines.report import ensure_markdown

    quiet.configure_logging(args.verbose)
    config = from_args(args)  # user errors (ValueError, OSError) are reported by jobs.cli
    if config.extract.decoder != DRY_RUN and importlib.util.find_spec("hpd_core.decoders") is None:
        print("hpd extract: error: the engine's decoders (hpd_core.decoders) are not installed; "
              "use --decoder dry-run to test the pipeline", file=sys.stderr)
        return 2
    with io.probing():  # an unreachable S3 endpoint is said in seconds (the job's own requests are tried longer)
        plan = preflight(config, args)  # every check; nothing written yet
    if plan.input_modified:
        print("hpd extract: warning: files of --input were modified since this job started (their modification "
              "times differ): if one was rewritten, the values already written are the old content's, and a resume "
              "stops at the first chunk whose rows changed; --overwrite starts the job over, a new --output keeps this one",
              file=sys.stderr)
    if plan.ignored:
        print(f"hpd extract: warning: {len(plan.ignored)} file(s) of --input are not read, as their names (or a folder's) "
              f"begin with _ or . (Spark's and Hadoop's markers): {plan.ignored[0]}"
              f"{', ...' if len(plan.ignored) > 1 else ''}; rename them to read them", file=sys.stderr)
    if plan.unsupported:
        print(f"hpd extract: warning: {len(plan.unsupported)} file(s) of --input are of no type it reads ({UNDERSTOOD}), "
              f"each read as one rejected row: {plan.unsupported[0]}{', ...' if len(plan.unsupported) > 1 else ''}; "
              "convert them (a CSV file: to JSON Lines or Parquet) or move them out", file=sys.stderr)
    if plan.nothing_to_skip:
        print(f"hpd extract: warning: --skip-existing {config.skip_existing}: no earlier output there (no folder under "
              "it holds a _job.json), so nothing is skipped and every product is extracted: right for the first run "
              "of a backfill; otherwise check the path", file=sys.stderr)
    if plan.empty:
        print(f"hpd extract: warning: --input {config.prepare.read.uri} holds no rows: a job of 0 products",
              file=sys.stderr)
    if plan.run_id != config.output.run_id:
        config = config.as_run(plan.run_id)
    if config.address is None and config.extract.decoder != DRY_RUN:  # actors on this machine
        from hpd_core.models import emulated_dtype_warning

        if (warning := emulated_dtype_warning(config.extract.dtype, "cpu")) is not None:
            print(f"hpd extract: warning: --dtype {warning} (actors on a GPU are not affected)", file=sys.stderr)
    output = config.output.uri
    if plan.complete:
        report = io.read_json(io.join(output, "_report.json"))
        ensure_markdown(output, report)
        print(f"run {config.output.run_id} is already complete in {output}: nothing to do "
              "(--overwrite starts it over)", file=sys.stderr)
        from pipelines import compact

        if io.exists(io.join(output, compact.MARKER)):
            print(f"hpd extract: warning: {compact.compacting_message(output)}", file=sys.stderr)
        print(_summary(report, output))
        return 1 if every_row_rejected(report) else 0
    overwrite = bool(args.overwrite and plan.existing_run is not None) or plan.leftovers
    if overwrite:
        from pipelines import attempts

        attempts.await_quiet(output, None, attempts.HEARTBEAT_SECONDS)  # before Ray starts
        if plan.leftovers and plan.existing_run is None:
            print(f"hpd extract: {output} holds only attempt records, left by a deletion that was stopped (an "
                  "--overwrite, or a failed run's clean-up): deleting them", file=sys.stderr)
        elif plan.leftovers:
            print(f"hpd extract: {output} holds part of the job {plan.existing_run} after `hpd compact` packed its "
                  "files, without its report: a deletion (an --overwrite) was stopped there; deleting the rest and "
                  "starting the job over", file=sys.stderr)
        else:
            print(f"--overwrite: deleting the job {plan.existing_run} in {output}", file=sys.stderr)
    if plan.empty:
        from pipelines.build import empty_job

        report = empty_job(prepare=config.prepare, extract=config.extract, output=config.output, report=config.report,
                           skip_existing=config.skip_existing, arguments=plan.arguments, overwrite=overwrite)
    else:
        report = _run_on_ray(config, args, plan.arguments, overwrite)
    print(_summary(report, output))
    return 1 if every_row_rejected(report) else 0
