"""`hpd extract` as a new user meets it: checks before Ray starts and before anything is written,
--overwrite, a failed run that leaves nothing behind, per-prompt failures, Ctrl-C, the quickstart
twice, quiet output by default and Ray's with --verbose."""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import checks, extract
from jobs.quiet import StderrFilter
from pipelines import attempts, io
from pipelines.build import ResourceConfig
from tests.pipelines.helpers import (
    REPO,
    SAMPLE,
    SAMPLE_ATTRIBUTES,
    WAIT_SECONDS,
    commits,
    extract_args,
    jsonl,
    read_attributes,
    read_rejected,
    report,
    run_extract,
    sample_records,
    start_extract,
    wait_for,
)

CLI = [sys.executable, "-m", "jobs.cli", "extract"]


def must_not_run(*args, **kwargs):
    raise AssertionError("the job started")


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if Ray is started or the job is run."""
    import ray

    import pipelines.build

    monkeypatch.setattr(ray, "init", must_not_run)
    monkeypatch.setattr(pipelines.build, "run_job", must_not_run)


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


# ------------------------------------------------------------------ checks before Ray starts


def test_data_files_under_hidden_names_are_named_in_a_warning(tmp_path, no_ray, capsys):
    """Files under a name that begins with _ or . are not read (_SUCCESS, .crc); one that looks like
    data is named, since its rows would otherwise be in no count."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.jsonl").write_text("\n")  # no rows: a finished job without Ray
    (source / "_SUCCESS").write_text("")
    (source / "_2024_export.jsonl").write_text(json.dumps({"product_id": "p", "category": "Shoes", "title": "t"}) + "\n")
    assert run_extract(extract_args(source, tmp_path / "out")) == 0
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "are not read" in line]
    assert warning.startswith("hpd extract: warning: 1 file(s) of --input are not read, as their names")
    assert "_2024_export.jsonl; rename them to read them" in warning and "_SUCCESS" not in warning


def test_a_file_of_another_format_than_its_name_is_refused_before_ray(tmp_path, no_ray, capsys):
    """A new user's walk (session 63): a .json file holding a JSON array, or pretty-printed JSON, and a
    Parquet file without a title column had every row rejected one by one, and the job exited 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"product_id": f"p{i}", "category": "Tea", "title": f"tea {i}"} for i in range(3)]
    array = tmp_path / "array.json"
    array.write_text(json.dumps(records))
    assert run_extract(extract_args(array, tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert f"--input {array} holds a JSON array (its first line begins with '['): hpd extract reads JSON Lines" in err
    assert "jq -c '.[]'" in err
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(records[0], indent=2))
    assert run_extract(extract_args(pretty, tmp_path / "out")) == 2
    assert f"--input {pretty} holds pretty-printed JSON (its first line is '{{' alone)" in capsys.readouterr().err
    table = pa.table({"product_id": ["p0"], "category": ["Tea"], "Title": ["tea 0"]})
    pq.write_table(table, tmp_path / "no-title.parquet")
    assert run_extract(extract_args(tmp_path / "no-title.parquet", tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert "has no column title (its columns: product_id, category, Title)" in err
    assert "column names are lower case: it has 'Title' for 'title'" in err
    assert not (tmp_path / "out").exists()


def test_a_mistyped_skip_existing_prefix_and_an_empty_input_are_warned_of(tmp_path, no_ray, capsys, monkeypatch):
    """--skip-existing naming no earlier output skips nothing (right on a backfill's first night, a
    whole catalog again after a typo): a warning says so before the job starts, as it does of an input
    without rows and of files beside the data that no reader reads (each one rejected row)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    argv = extract_args(empty, tmp_path / "runs" / "dt=2", "--skip-existing", tmp_path / "runs-typo")
    assert run_extract(argv) == 0
    err = capsys.readouterr().err
    assert f"hpd extract: warning: --skip-existing {tmp_path / 'runs-typo'}: no earlier output there" in err
    assert f"hpd extract: warning: --input {empty} holds no rows: a job of 0 products" in err
    argv = extract_args(empty, tmp_path / "runs" / "dt=3", "--skip-existing", tmp_path / "runs")
    assert run_extract(argv) == 0  # dt=2 is an earlier output under the prefix
    assert "--skip-existing" not in capsys.readouterr().err
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"product_id": "p", "category": "Tea", "title": "t"}) + "\n")
    (folder / "notes.txt").write_text("a note\n")
    monkeypatch.setattr(extract, "_run_on_ray", must_not_run)  # whether or not this process's Ray is up
    with pytest.raises(AssertionError, match="the job started"):
        run_extract(extract_args(folder, tmp_path / "out-mixed"))
    err = capsys.readouterr().err
    assert "hpd extract: warning: 1 file(s) of --input are of no type it reads" in err
    assert f"each read as one rejected row: {folder / 'notes.txt'}" in err


def test_an_input_folder_holding_the_schema_or_labels_is_refused_before_ray(tmp_path, no_ray, capsys):
    """A folder --input laid out as the README lays out a catalog (records.jsonl beside
    attributes.json) read the schema's lines as records: rejected rows, and --limit used up by
    them (a new user's walk, session 52). Labels (gold.jsonl) likewise."""
    import shutil

    catalog = tmp_path / "my-catalog"
    catalog.mkdir()
    (catalog / "records.jsonl").write_text(json.dumps({"product_id": "p", "category": "Shoes", "title": "t"}) + "\n")
    shutil.copy(SAMPLE_ATTRIBUTES, catalog / "attributes.json")
    assert run_extract(extract_args(catalog, tmp_path / "out", attributes=catalog / "attributes.json")) == 2
    err = capsys.readouterr().err
    assert f"--attributes {catalog / 'attributes.json'} lies inside --input {catalog}" in err
    (catalog / "attributes.json").rename(tmp_path / "attributes.json")
    (catalog / "schema-link.json").symlink_to(tmp_path / "attributes.json")  # the schema by another name
    assert run_extract(extract_args(catalog, tmp_path / "out", attributes=tmp_path / "attributes.json")) == 2
    assert f"--attributes {tmp_path / 'attributes.json'} lies inside --input {catalog}" in capsys.readouterr().err
    (catalog / "schema-link.json").unlink()
    (catalog / "gold.jsonl").write_text(json.dumps({"product_id": "p", "category": "Shoes", "target_scores": {}}) + "\n")
    assert run_extract(extract_args(catalog, tmp_path / "out", attributes=tmp_path / "attributes.json")) == 2
    err = capsys.readouterr().err
    assert f"--input {catalog} holds labels ({catalog / 'gold.jsonl'})" in err
    assert f"give --input the records' file ({catalog / 'records.jsonl'})" in err
    assert not (tmp_path / "out").exists()


def test_missing_input_fails_within_seconds_and_writes_nothing(tmp_path):
    output = tmp_path / "out"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([*CLI, "--input", tmp_path / "nope.jsonl", "--attributes", SAMPLE_ATTRIBUTES, "--output", output],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the command (about its wall time on an idle machine; unlike wall time, not
    # stretched by other work on a shared test machine): ~2 s, since no Ray is started
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 10
    assert done.returncode == 2 and not output.exists()
    assert done.stderr.strip().splitlines() == [
        f"hpd extract: error: --input {tmp_path / 'nope.jsonl'} does not exist"]


def test_missing_s3_input_fails_before_ray_and_writes_nothing(s3_server, no_ray, capsys):
    bucket = s3_server.make_bucket("missing")
    argv = extract_args(f"s3://{bucket}/records/", f"s3://{bucket}/out")
    assert run_extract(argv) == 2
    assert f"--input s3://{bucket}/records does not exist" in capsys.readouterr().err
    assert io.list_files(f"s3://{bucket}") == []


def test_an_unreachable_s3_endpoint_is_reported_in_seconds(no_ray, capsys, monkeypatch):
    """The job's own S3 requests are tried 10 times (about 80 s against a closed port); the checks
    before it starts are tried twice, so a wrong endpoint is a quick error (helper-32, session 52)."""
    import time

    from tests.conftest import free_port

    for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "k",
                        "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    started = time.monotonic()
    assert run_extract(extract_args(SAMPLE, "s3://some-bucket/out")) == 2
    assert time.monotonic() - started < 20
    assert "hpd extract: error:" in capsys.readouterr().err


def test_a_missing_output_bucket_fails_before_ray(s3_server, no_ray, capsys):
    assert run_extract(extract_args(SAMPLE, "s3://no-such-bucket-hpd-test/out")) == 2
    assert "--output s3://no-such-bucket-hpd-test/out: the bucket does not exist" in capsys.readouterr().err


def test_empty_input_is_a_finished_job_of_zero_products_without_ray_or_a_model(tmp_path, no_ray, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    output = tmp_path / "out"
    argv = ["--input", empty, "--attributes", SAMPLE_ATTRIBUTES, "--output", output]  # the real default model
    assert run_extract(argv) == 0
    result = report(str(output))
    assert result["rows_in"] == result["products_out"] == 0 and result["usd_per_1k_products"] is None
    out = capsys.readouterr().out
    assert "0 rows in, 0 products out" in out and "rejected rows:    none" in out
    assert "$None" not in (output / "_report.md").read_text()
    markdown = (output / "_report.md").read_text()
    (output / "_report.md").unlink()  # killed between _report.json and _report.md (by a version that wrote them so)
    assert run_extract(argv) == 0 and "already complete" in capsys.readouterr().err
    assert (output / "_report.md").read_text() == markdown  # written again from _report.json


def test_unknown_model_fails_in_one_line_before_ray(tmp_path, no_ray, capsys):
    argv = ["--input", SAMPLE, "--attributes", SAMPLE_ATTRIBUTES, "--output", tmp_path / "out", "--model", "smolm2"]
    assert run_extract(argv) == 2
    (line,) = error_lines(capsys)
    assert "--model 'smolm2' is not an embedded model (default, default-base" in line and "Hugging Face cache" in line
    assert not (tmp_path / "out").exists()


def test_a_hub_id_is_accepted_when_it_is_in_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "hub_cache", lambda: tmp_path)
    (tmp_path / "models--org--tiny" / "snapshots" / "0123").mkdir(parents=True)
    checks.check_model("org/tiny", None)
    with pytest.raises(ValueError, match="--model 'org/other' is not an embedded model"):
        checks.check_model("org/other", None)
    with pytest.raises(ValueError, match="--adapter 'org/adapter' is not an embedded model"):
        checks.check_model("org/tiny", "org/adapter")


def test_a_missing_s3_model_fails_before_ray(s3_server, tmp_path, no_ray, capsys):
    bucket = s3_server.make_bucket("model")
    argv = ["--input", SAMPLE, "--attributes", SAMPLE_ATTRIBUTES, "--output", tmp_path / "out",
            "--model", f"s3://{bucket}/models/none/"]
    assert run_extract(argv) == 2
    assert f"--model s3://{bucket}/models/none/: nothing there" in capsys.readouterr().err


def test_an_s3_model_needs_no_embedded_models_package(s3_server, monkeypatch):
    """The cluster image installs no embedded model: a job with --model s3://... passes the checks
    (before, they checked the default model's package for it and every cluster command failed)."""
    from hpd_core import models
    from jobs import checks

    bucket = s3_server.make_bucket("image")
    s3_server.client().put_object(Bucket=bucket, Key="models/m/config.json", Body=b"{}")

    def not_installed(embedded):
        raise FileNotFoundError(f"this model needs the {embedded.pip_name} package")

    monkeypatch.setattr(models, "_package_dir", not_installed)
    checks.check_model(f"s3://{bucket}/models/m/", None)
    with pytest.raises(FileNotFoundError, match="adapter"):
        checks.check_model(f"s3://{bucket}/models/m/", "./no-such-adapter")
    with pytest.raises(FileNotFoundError, match="needs the"):
        checks.check_model("default", None)  # an embedded model still needs its package


def test_files_fingerprint_follows_the_content_not_the_place(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
        (tmp_path / name / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 20000)  # 5 MB
    assert checks.files_fingerprint(tmp_path / "a") == checks.files_fingerprint(tmp_path / "b")  # a copy
    weights = bytearray((tmp_path / "b" / "adapter_model.safetensors").read_bytes())
    weights[-7] ^= 1  # retrained: the same size, other bytes at the end
    (tmp_path / "b" / "adapter_model.safetensors").write_bytes(bytes(weights))
    assert checks.files_fingerprint(tmp_path / "a") != checks.files_fingerprint(tmp_path / "b")
    files = checks.model_files("default", None)
    assert files["model"].startswith("embedded:") and files["adapter"] is None and files == checks.model_files("default", None)


def test_a_resume_by_a_version_that_prompts_otherwise_is_refused(tmp_path, no_ray, capsys):
    """A job records how its version prompts (hpd_core.prompts.PROMPT_FORMAT); a resume by a version
    that prompts otherwise would write values of two prompts into one output. A job from before the
    record prompted with format 1 or 2, and is refused too."""
    from jobs.config import from_args
    from hpd_core import prompts
    from pipelines import commit

    argv = ["--input", SAMPLE, "--attributes", SAMPLE_ATTRIBUTES, "--output", tmp_path / "out"]
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    args = parser.parse_args([str(a) for a in argv])
    config = from_args(args)
    plan = checks.preflight(config, args)
    assert plan.arguments[checks.PROMPT_FORMAT] == prompts.PROMPT_FORMAT
    older = {**plan.arguments, checks.PROMPT_FORMAT: prompts.PROMPT_FORMAT - 1}
    commit.claim_output(config.output.uri, config.output.run_id, older)  # begun by the version before
    assert run_extract(argv) == 2
    err = capsys.readouterr().err
    assert f"prompt format {prompts.PROMPT_FORMAT - 1}; this version's: {prompts.PROMPT_FORMAT}" in err
    overwrite = parser.parse_args([*map(str, argv), "--overwrite"])
    assert checks.preflight(from_args(overwrite), overwrite).existing_run == config.output.run_id  # not refused

    older = {k: v for k, v in plan.arguments.items() if k not in (checks.PROMPT_FORMAT, checks.INPUT_MODIFIED)}
    io.write_json(io.join(config.output.uri, "_job.json"),
                  {**io.read_json(io.join(config.output.uri, "_job.json")), "arguments": older})
    assert run_extract(argv) == 2  # begun before input_modified was recorded: before the title went last
    assert f"prompt format 1; this version's: {prompts.PROMPT_FORMAT}" in capsys.readouterr().err

    unrecorded = {k: v for k, v in plan.arguments.items() if k != checks.PROMPT_FORMAT}  # begun in between
    io.write_json(io.join(config.output.uri, "_job.json"),
                  {**io.read_json(io.join(config.output.uri, "_job.json")), "arguments": unrecorded})
    assert run_extract(argv) == 2  # it prompted with format 1 or 2, never this version's 3
    assert f"prompt format 1 or 2 (not recorded); this version's: {prompts.PROMPT_FORMAT}" in capsys.readouterr().err


def test_a_resume_with_the_adapter_changed_under_its_name_is_refused(tmp_path, no_ray, capsys):
    """Before, the run id knew the adapter by its path alone: a resume after retraining it in place
    was accepted, and the output held two adapters' values."""
    from jobs.config import from_args
    from pipelines import commit

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    argv = ["--input", SAMPLE, "--attributes", SAMPLE_ATTRIBUTES, "--output", tmp_path / "out", "--adapter", adapter]
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    args = parser.parse_args([str(a) for a in argv])
    config = from_args(args)
    plan = checks.preflight(config, args)
    commit.claim_output(config.output.uri, config.output.run_id, plan.arguments)  # the first sitting began
    assert checks.preflight(config, args).existing_run == config.output.run_id  # unchanged: a resume
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    assert run_extract(argv) == 2
    assert f"--adapter {adapter} changed since the job in --output" in capsys.readouterr().err


def test_a_folder_that_is_not_an_hpd_output_is_refused_and_left_alone(tmp_path, no_ray, capsys):
    output = tmp_path / "mine"
    output.mkdir()
    (output / "notes.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        assert run_extract(extract_args(SAMPLE, output, *extra)) == 2
        assert "holds files that are not an hpd extract output" in capsys.readouterr().err
    assert [p.name for p in output.iterdir()] == ["notes.txt"]
    assert run_extract(extract_args(SAMPLE, output / "notes.txt")) == 2
    assert f"--output {output / 'notes.txt'} is a file: give a folder" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "keep me"


def test_help_shows_every_default():
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    for action in parser._actions:
        if action.option_strings and not action.required and action.nargs != 0:
            assert "default" in (action.help or ""), action.option_strings


def test_the_command_line_needs_no_ray_to_start():
    """The GPU machine's image runs `hpd bench` without Ray: building the command line (every
    subcommand's options, --device's choices included) must not import it."""
    blocker = ("import sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'ray' or name.startswith('ray.'):\n"
               "            raise ImportError('no ray here')\n"
               "sys.meta_path.insert(0, Block())\n"
               "from jobs.cli import main\n"
               "raise SystemExit(main(['bench', '--help']))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", blocker], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--synthetic" in done.stdout


def test_summary_points_at_rejected_rows_only_when_there_are_some():
    base = {"run_id": "r", "rows_in": 3, "products_out": 3, "rows_rejected": 0, "rejected_by_stage": {},
            "rows_skipped": 0, "wall_seconds": 1.0, "attempts": 1}
    assert "rejected rows:    none" in extract._summary(base, "out")
    some = dict(base, products_out=2, rows_rejected=1, rejected_by_stage={"validate": 1})
    assert "1 rejected (validate 1)" in extract._summary(some, "out") and "out/rejected/" in extract._summary(some, "out")
    assert "--stage extract" not in extract._summary(some, "out")  # bad input: another run rejects it again
    assert "why they were rejected, by stage and reason: hpd rejected out" in extract._summary(some, "out")
    assert "hpd rejected" not in extract._summary(base, "out")
    none_out = dict(some, products_out=0, rows_in=1)
    assert "warning: every row was rejected (exit status 1); the reasons, most frequent first: hpd rejected out" in \
        extract._summary(none_out, "out")
    assert "every row" not in extract._summary(dict(none_out, rows_in=2, rows_skipped=1), "out")  # one skipped
    failed = dict(base, products_out=1, rows_rejected=2, rejected_by_stage={"extract": 2})
    assert "the 2 rejected at extract, to run again: hpd rejected out --stage extract --out FILE.jsonl" in \
        extract._summary(failed, "out")
    assert "cut to --max-text-chars" not in extract._summary(base, "out")
    assert "2 product(s) had their text cut to --max-text-chars" in extract._summary(dict(base, inputs_truncated=2), "out")
    assert "CUDA graph" not in extract._summary(base, "out")
    assert "warning: 2 CUDA graph capture(s) failed" in extract._summary(dict(base, cuda_graph_failures=2), "out")
    assert "confidence" not in extract._summary(base, "out")
    assert "one folder per category; each value with its confidence)" in extract._summary(dict(base, confidence=True), "out")
    assert "sliding window" not in extract._summary(dict(base, values_beyond_window=0, attribute_rows=40), "out")
    assert "warning: 5 of 40 values were decoded a sliding window or more positions after their product's text" in \
        extract._summary(dict(base, values_beyond_window=5, attribute_rows=40), "out")


def test_summary_notes_categories_of_only_null_values_and_schema_categories_without_products():
    base = {"run_id": "r", "output": "out", "rows_in": 3, "products_out": 3, "rows_rejected": 0,
            "rejected_by_stage": {}, "rows_skipped": 0, "wall_seconds": 1.0, "attempts": 1}
    assert "note:" not in extract._summary(base, "out")  # a report without per-category counts
    table = {"Tea": {"products": 2, "attribute_rows": 6, "values": 4, "null_share": 0.3333},
             "Wine": {"products": 1, "attribute_rows": 3, "values": 0, "null_share": 1.0}}
    text = extract._summary(dict(base, by_category=table, categories_without_products=["Beer", "Cider"]), "out")
    assert "note: every value was null in 1 category: Wine (1 product); check their attribute names" in text
    assert "note: 2 of the schema's categories had no product in this run: Beer, Cider (none among the rows " \
        "read; records that spell a category otherwise are rejected: hpd rejected out)" in text
    full = dict(base, by_category={"Tea": table["Tea"]}, categories_without_products=[])
    assert "note:" not in extract._summary(full, "out")
    many = [f"C{i}" for i in range(8)]
    assert "C0, C1, C2, C3, C4 and 3 more" in extract._summary(dict(full, categories_without_products=many), "out")
    rejected = dict(base, products_out=0, rows_rejected=3, rejected_by_stage={"validate": 3}, by_category={},
                    categories_without_products=["Tea"])
    assert "note:" not in extract._summary(rejected, "out")  # every row rejected: warned of already


def test_summary_warns_when_prompts_are_far_from_full():
    """Categories mixed row by row leave prompts nearly empty (a prompt stacks one category of one
    chunk); a job of many prompts that filled under half of J says so and what to do."""
    base = {"run_id": "r", "rows_in": 900, "products_out": 900, "rows_rejected": 0, "rejected_by_stage": {},
            "rows_skipped": 0, "wall_seconds": 1.0, "docs_per_prompt": 6}
    mixed = dict(base, prompts=800, products_per_prompt=1.12)
    assert "prompts held 1.12 products on average against J = 6" in extract._summary(mixed, "out")
    assert "sort or partition it by category" in extract._summary(mixed, "out")
    for quiet in (dict(base, prompts=160, products_per_prompt=5.6), dict(base, prompts=40, products_per_prompt=1.2),
                  dict(base, prompts=800, products_per_prompt=1.0, docs_per_prompt=1), dict(base, prompts=0, products_per_prompt=None)):
        assert "products on average" not in extract._summary(quiet, "out"), quiet


# ------------------------------------------------------------------ runs (the session's Ray)


def test_an_attempt_counts_the_start_of_ray(ray_cluster, tmp_path, monkeypatch):
    """An attempt's time, and so its cost, begins before its driver starts or joins Ray (8-12 s
    on this machine, uncounted before: helper-37's drill found six attempts of about 150 s
    reported as 47.8 s). Ray's start is stood in for by a wait in ray.init (the session's Ray
    is joined already)."""
    import ray

    joined = ray.is_initialized

    def start_ray(*args, **kwargs):
        time.sleep(3)
        monkeypatch.setattr(ray, "is_initialized", joined)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", start_ray)
    before = time.time()
    assert run_extract(extract_args(SAMPLE, tmp_path / "out", "--limit", 4)) == 0
    (attempt,) = attempts.load_all(str(tmp_path / "out"))
    assert before <= attempt.started_at < before + 1 and attempt.updated_at - attempt.started_at >= 3


def test_overwrite_deletes_the_earlier_job_and_starts_over(ray_cluster, tmp_path, capsys):
    output = tmp_path / "out"
    assert run_extract(extract_args(SAMPLE, output, "--chunk-rows", 4, "--limit", 12)) == 0
    first = report(str(output))
    capsys.readouterr()
    again = extract_args(SAMPLE, output, "--chunk-rows", 10)
    assert run_extract(again) == 2  # never implied
    assert "--chunk-rows (there: 4; here: 10); --limit (there: 12; here: not given)" in capsys.readouterr().err
    assert run_extract([*again, "--overwrite"]) == 0
    result = report(str(output))
    assert result["run_id"] != first["run_id"] and result["rows_in"] == 40 and result["attempts"] == 1
    new_commits = commits(str(output))
    assert len(new_commits) == 4  # 4 chunks of 10; none of the first job's 3 chunks of 4 left
    keys = {f"{c.rsplit('/', 2)[1]}-{int(c.rsplit('/', 1)[1].split('.')[0]):06d}" for c in new_commits}
    files = io.list_files(str(output / "attributes"))
    assert files and all(f.rsplit("/", 1)[1].removesuffix(".parquet") in keys for f in files)  # no stale chunk
    assert sorted(read_attributes(str(output)).column("product_id").unique().to_pylist()) == sorted(
        r["product_id"] for r in sample_records())


def test_a_compacted_job_whose_deletion_stopped_is_run_anew_not_resumed(ray_cluster, tmp_path, capsys):
    """An --overwrite of a compacted output killed after the report, the manifests and the id index
    went, before the data: the same command without --overwrite resumed it, ran every chunk again and
    left the packed files beside their new ones, every row twice (helper-53, session 57). The marks of
    `hpd compact` now go after the data, and while one is there the deletion is finished instead."""
    import shutil

    from jobs import cli
    from pipelines import commit, compact

    records = [{"product_id": f"p{i:03d}", "category": ["Tea", "Shoes"][i % 2], "title": f"product {i}"} for i in range(60)]
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records))
    output = tmp_path / "out"
    argv = extract_args(source, output, "--chunk-rows", 10, "--group-chunks", 1)
    assert run_extract(argv) == 0
    assert cli.main(["compact", str(output)]) == 0
    rows = read_attributes(str(output)).num_rows
    names = sorted(p.name for p in output.iterdir())
    order = sorted(names, key=lambda name: (commit._deletion_rank(name), name))  # as commit.discard goes
    assert order.index(compact.DONE) > max(order.index("attributes"), order.index("_dedup"))
    for name in order[: order.index("attributes")]:  # what a deletion stopped before attributes/ left
        shutil.rmtree(output / name) if (output / name).is_dir() else (output / name).unlink()
    capsys.readouterr()
    assert run_extract(argv) == 0
    assert "a deletion (an --overwrite) was stopped there; deleting the rest and starting the job over" in capsys.readouterr().err
    table = read_attributes(str(output))
    assert table.num_rows == rows and sorted(set(table.column("product_id").to_pylist())) == [r["product_id"] for r in records]
    assert not (output / compact.DONE).exists() and report(str(output))["products_out"] == len(records)


def test_an_output_left_with_only_attempt_records_is_cleared_and_run(ray_cluster, tmp_path, capsys):
    """A deletion killed after the claim went (--overwrite, or a failed run's clean-up: a pod's grace
    period spent on a long S3 delete) leaves only attempt records: such an output was refused as
    "not an hpd extract output", --overwrite too (helper-50, session 56). Their records are deleted
    (under a lease) and the job runs, its report counting its own attempt only."""
    output = tmp_path / "out"
    now = time.time()
    attempts.save(str(output), attempts.Attempt(f"{int(now * 1000) - 9:015d}-other-host-7", now - 99, now - 60, "cpu",
                                                1, 0.0425))
    (output / attempts.DIRECTORY / ".tmp-x-0").write_text("{")
    assert run_extract(extract_args(SAMPLE, output, "--limit", 4)) == 0
    assert "holds only attempt records, left by a deletion that was stopped" in capsys.readouterr().err
    assert report(str(output))["attempts"] == 1 and report(str(output))["products_out"] == 4
    (output / "stray.txt").write_text("x")  # anything else is still refused
    other = tmp_path / "other"
    attempts.save(str(other), attempts.Attempt("000000000000001-h-1", 1.0, 2.0, "cpu", 1, 0.0425))
    (other / "stray.txt").write_text("x")
    assert run_extract(extract_args(SAMPLE, other, "--limit", 4)) == 2
    assert "holds files that are not an hpd extract output" in capsys.readouterr().err


def test_a_failed_run_leaves_nothing_and_the_corrected_command_runs(ray_cluster, tmp_path, capsys):
    import ray

    source = tmp_path / "in.jsonl"
    records = [{"product_id": f"t{i}", "category": "Tea", "title": f"tea {i}"} for i in range(6)]
    source.write_bytes(jsonl(records))
    output = tmp_path / "out"
    failing = [a for i in range(0, 6, 2) for a in ("--dry-run-fail", f"t{i}")]  # every prompt (J = 2) fails
    assert run_extract(extract_args(source, output, "--docs-per-prompt", 2, *failing)) == 1
    (line,) = [line for line in error_lines(capsys) if "hpd extract" in line]
    assert line.startswith("hpd extract: failed: RuntimeError: every one of 3 prompts failed")
    assert list(output.iterdir()) == []  # no _job.json: nothing of the failed run is left
    # nor its actor pool: its CPUs come back at once (they waited for the cyclic collector: 10-15 s)
    deadline = time.monotonic() + 5
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]
    assert run_extract(extract_args(source, output, "--docs-per-prompt", 2)) == 0  # no --overwrite needed
    assert report(str(output))["products_out"] == 6


def test_prompts_the_decoder_fails_on_become_rejected_rows_with_the_reason(ray_cluster, tmp_path):
    source = tmp_path / "in.jsonl"
    records = [{"product_id": f"p{i}", "category": "Tea", "title": f"tea {i}"} for i in range(12)]
    source.write_bytes(jsonl(records))
    output = tmp_path / "out"
    argv = extract_args(source, output, "--docs-per-prompt", 2, "--chunk-rows", 6,
                        "--dry-run-fail", "p1", "--dry-run-fail", "flaky:p4", "--dry-run-fail", "error:p9")
    assert run_extract(argv) == 0
    result = report(str(output))
    rejected = {json.loads(r["record"])["product_id"]: r for r in read_rejected(str(output))}
    assert set(rejected) == {"p0", "p1", "p8", "p9"}  # the prompts of p1 and p9; p4's succeeded on retry
    assert all(r["stage"] == "extract" for r in rejected.values())
    assert "DryRunFailure: simulated decoder failure on a prompt holding 'p1'" in rejected["p0"]["reason"]
    assert rejected["p8"]["reason"] == "extract error: simulated engine error on a prompt holding 'p9'"
    written = set(read_attributes(str(output)).column("product_id").to_pylist())
    assert written == {f"p{i}" for i in range(12)} - set(rejected)
    assert result["rejected_by_stage"] == {"extract": 4} and result["products_out"] == 8


def test_a_job_whose_every_row_was_rejected_exits_1(ray_cluster, tmp_path, capsys):
    """Every row rejected (here: a category the schema names otherwise) is a job that ran and wrote its
    rejected rows and report, but a scheduler must not take it for a success: exit status 1, also when
    the finished job is run again; each reason names the schema's near category."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([{"product_id": f"p{i}", "category": "Teas", "title": f"tea {i}"} for i in range(3)]))
    argv = extract_args(source, tmp_path / "out")
    assert run_extract(argv) == 1
    assert "warning: every row was rejected (exit status 1)" in capsys.readouterr().out
    reasons = {r["reason"] for r in read_rejected(str(tmp_path / "out"))}
    assert reasons == {"unknown category 'Teas' (not in the attribute schema, --attributes; did you mean 'Tea'? "
                       "categories are matched exactly)"}
    assert run_extract(argv) == 1 and "already complete" in capsys.readouterr().err


def test_verbose_brings_back_rays_logs(ray_cluster, tmp_path, capfd, recwarn):
    import logging

    import ray.data  # noqa: F401  (it adds its console handler to the "ray.data" logger on import)

    # That handler keeps the sys.stderr of the moment ray.data was first imported: under pytest,
    # when an earlier test imported it, that is pytest's capture of then, not what capfd reads here
    # (an `hpd extract` process imports it with its own stderr)
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and type(handler).__module__.startswith("ray."):  # not pytest's
            handler.stream = sys.stderr  # not setStream: it flushes the old stream, which may be closed
    # two chunks of one input file: two actors, one shard to prepare
    assert run_extract(extract_args(SAMPLE, tmp_path / "quiet", "--limit", 4, "--chunk-rows", 2)) == 0
    quiet = capfd.readouterr().err
    # Ray Data's deprecation of the actors' max_restarts argument is nothing a user can act on, nor
    # its warning that a task pool is larger than the shards it gets
    assert not [w for w in recwarn if "ray_remote_args" in str(w.message)]
    assert not [w for w in recwarn if "maximum number of concurrent tasks" in str(w.message)]
    assert run_extract(extract_args(SAMPLE, tmp_path / "loud", "--limit", 4, "--verbose")) == 0
    loud = capfd.readouterr().err
    assert "Execution plan" not in quiet and "extract: 4/4 rows (100%)" in quiet
    assert "Execution plan" in loud  # Ray Data's own logs


def test_stderr_filter_drops_rays_harmless_notices_and_a_dead_raylets_log_and_keeps_the_rest():
    code = (
        "import os, sys\n"
        "from jobs.quiet import StderrFilter\n"
        "with StderrFilter():\n"
        "    os.write(2, b\"[2026-11-23 16:52:11,646 E 1 1] core_worker.cc:2465: Actor with class name: 'X' and ID: 'a' "
        "has constructor arguments in the object store and max_restarts > 0. If the arguments...\\n\")\n"
        "    os.write(2, b'[2026-11-23 E 1 1] core_worker.cc:1: a real error\\n')\n"
        "    os.write(2, b'\\x1b[33m(raylet)\\x1b[0m Task MapWorker(MapBatches(ExtractStage)).submit failed. There are infinite "
        "retries remaining, so the task will be retried. Error: The actor is dead because it was killed by `ray.kill`.\\n')\n"
        "    os.write(2, b'\\x1b[33m(raylet)\\x1b[0m Task MapWorker(MapBatches(ExtractStage)).submit failed. There are "
        "infinite retries remaining, so the task will be retried. Error: The actor is temporarily unavailable: RpcError: "
        "RPC error: Socket closed rpc_code: 14\\n')\n"
        "    os.write(2, b'\\x1b[33m(raylet)\\x1b[0m A worker died or was killed while executing a task by an unexpected "
        "system error.\\n')\n"
        "    os.write(2, b'\\x1b[33m(raylet)\\x1b[0m Task X failed. There are infinite retries remaining, so the task will be "
        "retried. Error: The actor is dead because its worker process has died.\\n')\n"
        "    os.write(2, b'    [state-dump] \\n    [2026-11-30 10:24:16,276 I 2776 2776] (raylet) node_manager.cc:1477: "
        "Disconnecting worker\\n')\n"  # a dead raylet's log, under Ray's line on its death
        "    os.write(2, b'    [2026-11-30 10:24:16,276 I 2776 2776] core_worker.cc:1: not the raylet\\n')\n"
        "    print('progress', end='', file=sys.stderr, flush=True)\n"
        "    os.write(2, b'\\rdone\\n')\n"
        "print('after', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0
    died = (b"\x1b[33m(raylet)\x1b[0m Task X failed. There are infinite retries remaining, so the task will be retried. "
            b"Error: The actor is dead because its worker process has died.\n")  # not one this job stopped: kept
    crashed = b"\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system error.\n"
    assert done.stderr == (b"[2026-11-23 E 1 1] core_worker.cc:1: a real error\n" + crashed + died
                           + b"    [2026-11-30 10:24:16,276 I 2776 2776] core_worker.cc:1: not the raylet\n"
                           + b"progress\rdone\nafter\n")
    assert StderrFilter(active=False).__enter__() is not None


@pytest.mark.parametrize("stop, code, said", [
    (signal.SIGINT, 130, "hpd extract: interrupted; run the same command again to resume"),
    # `ray job stop`, a pod or scheduler stopping the job: under Ray's own handler the driver exits 15
    # here (joined cluster; a local Ray the job starts aborts it with a stack dump, exit 134)
    (signal.SIGTERM, 143, "hpd extract: stopped (SIGTERM); run the same command again to resume"),
], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_without_a_traceback_and_the_run_resumes(ray_cluster, tmp_path, stop, code, said):
    records = [dict(r, product_id=f"x{i}") for i, r in enumerate(sample_records() * 2)]
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records))
    output = str(tmp_path / "out")
    argv = extract_args(source, output, "--chunk-rows", 8, "--dry-run-seconds-per-prompt", 0.1)
    driver = start_extract(argv, ray_cluster.address, {"RAY_DATA_AUTOSCALING_REQUEST_EXPIRE_TIME_S": "15"},
                           ctrl_c=True)
    wait_for(lambda: len(commits(output)) >= 2 or driver.poll() is not None, "two commits")
    driver.send_signal(stop)
    log = driver.communicate(timeout=WAIT_SECONDS)[0].decode()
    assert driver.returncode == code, log[-3000:]
    assert "Traceback" not in log and "SIGTERM received" not in log and said in log
    kept = len(commits(output))
    assert kept >= 2 and not io.exists(io.join(output, "_report.json"))
    assert run_extract(argv) == 0
    result = report(output)
    assert result["rows_in"] == len(records) == result["products_out"] and result["attempts"] == 2


@pytest.mark.slow  # 50 s: it waits for real heartbeats; tests/pipelines/test_report.py holds the lease's rules in seconds
def test_a_second_attempt_beside_a_running_one_gives_way_and_leaves_its_files(ray_cluster, tmp_path, capsys):
    """Two attempts on one output would write the same chunks, and one that failed with nothing
    committed used to delete the other's files (helper-27, session 51)."""
    records = [dict(r, product_id=f"y{i}") for i, r in enumerate(sample_records())]
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records))
    output = str(tmp_path / "out")
    # long enough (10 prompts of 4.5 s) for the others to see it refresh its record (every 15 s) twice
    argv = extract_args(source, output, "--chunk-rows", 40, "--dry-run-seconds-per-prompt", 4.5)
    driver = start_extract(argv, ray_cluster.address, {"RAY_DATA_AUTOSCALING_REQUEST_EXPIRE_TIME_S": "15"})
    wait_for(lambda: io.exists(io.join(output, "_dedup", "_index.json")) or driver.poll() is not None, "the first's index")
    assert run_extract(argv) == 2  # once it has seen the running one refresh its record
    assert "another `hpd extract` is working on" in capsys.readouterr().err
    assert run_extract([*argv, "--overwrite"]) == 2  # nor is a job at work deleted
    assert "another `hpd extract` is working on" in capsys.readouterr().err
    log = driver.communicate(timeout=WAIT_SECONDS)[0].decode()
    assert driver.returncode == 0, log[-3000:]
    result = report(output)
    assert result["products_out"] == len(records) and result["attempts"] == 1
    assert sorted(read_attributes(output).column("product_id").unique().to_pylist()) == sorted(r["product_id"] for r in records)
    assert run_extract(argv) == 0  # finished: the next run is told so, and records no attempt
    assert report(output)["attempts"] == 1 and len(attempts.load_all(output)) == 1


def test_quickstart_twice_with_and_without_limit(ray_cluster, tmp_path):
    env = dict(os.environ, HPD_QUICKSTART_SETUP="0", HPD_QUICKSTART_OUT=str(tmp_path / "qs"), RAY_ADDRESS=ray_cluster.address,
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    runs = []
    for extra in (["--limit", "6"], []):
        done = subprocess.run(["bash", "scripts/quickstart.sh", "--decoder", "dry-run", *extra], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=WAIT_SECONDS)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(done)
    assert report(str(tmp_path / "qs-decoder-dry-run-limit-6"))["rows_in"] == 6
    assert report(str(tmp_path / "qs-decoder-dry-run"))["rows_in"] == 40
    quiet = runs[1].stderr
    assert "extract: 40/40 rows (100%)" in quiet
    for noise in ("core_worker.cc", "Total Progress", "logging_progress", "Execution plan", "MapWorker", "Traceback"):
        assert noise not in quiet, noise
    assert f"report:           {tmp_path / 'qs-decoder-dry-run'}/_report.md" in runs[1].stdout
    # then a first look at the values (scripts/show_values.py): the dry run's are all null
    preview = runs[1].stdout.split(f"2 products of {tmp_path / 'qs-decoder-dry-run'}/attributes/:\n")[1].splitlines()
    titles = {json.loads(line)["title"] for line in (REPO / "samples" / "oa-mine-sample.jsonl").read_text().splitlines()}
    heads = [line for line in preview if not line.startswith("    ")]
    assert len(heads) == 2 and all(h.split("  (")[0].strip() in titles and "oa-mine-test-" in h for h in heads)
    assert all(line.endswith(": null") for line in preview if line.startswith("    "))


def test_an_actor_that_keeps_dying_stops_the_job_after_its_restarts(ray_cluster, tmp_path):
    """An actor killed on every try (as for memory) is restarted --actor-restarts times, then the job
    stops with the cause in one line; Ray Data's default would restart it without end (the driver's
    timeout below would fail the test)."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([{"product_id": f"p{i}", "category": "Tea", "title": f"tea {i}"} for i in range(12)]))
    output = str(tmp_path / "out")
    argv = extract_args(source, output, "--chunk-rows", 4, "--max-actors", 1, "--actor-restarts", 1,
                        "--dry-run-fail", "crash:p9")
    driver = start_extract(argv, ray_cluster.address)
    try:
        log = driver.communicate(timeout=2 * WAIT_SECONDS)[0].decode()  # a restart is a new worker process
    except subprocess.TimeoutExpired:
        driver.kill()
        pytest.fail(f"the job still ran after {2 * WAIT_SECONDS} s: its dying actor was restarted without end")
    assert driver.returncode == 1, log[-3000:]
    (line,) = [line for line in log.splitlines() if line.startswith("hpd extract: failed:")]
    assert "an extract actor's process died 2 time(s) (--actor-restarts 1): " in line
    assert "Worker unexpectedly exits" in line and "--max-actors" in line and "run the same command again" in line
    assert "Traceback" not in log
    assert not io.exists(io.join(output, "_report.json"))


def test_actor_restarts_must_be_a_count(no_ray, tmp_path, capsys):
    assert run_extract(extract_args(SAMPLE, tmp_path / "out", "--actor-restarts", -1)) == 2
    assert "--actor-restarts must be an int >= 0, got -1" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    assert f"(default: {ResourceConfig.actor_restarts})" in " ".join(parser.format_help().split())


def test_an_error_ray_data_raises_from_its_empty_marker_is_named_with_its_own_text():
    """Ray Data raises errors it does not blame on user code ``from SystemException()`` (empty): a
    job whose actor Ray's memory monitor killed once said only "failed: SystemException: "."""
    from ray.data.exceptions import SystemException
    from ray.exceptions import OutOfMemoryError

    err = OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node was 22.9GB")
    err.__cause__ = SystemException()
    line = extract.failure_line(err, 3)
    assert line.startswith("OutOfMemoryError: Task was killed due to the node running low on memory. Out of memory")
    assert "--max-actors" in line and "SystemException" not in line
    plain = RuntimeError("every one of 3 prompts failed")
    plain.__cause__ = SystemException()
    assert extract.failure_line(plain, 3) == "RuntimeError: every one of 3 prompts failed"


def test_an_actor_whose_owners_node_crashed_is_not_said_to_have_died_restarts_plus_one_times():
    """The driver's node gone (its raylet killed) ends an actor for good, whatever --actor-restarts says
    (seen with Ray 2.60: "an extract actor's process died 4 time(s) ... Owner's node has crashed")."""
    actor_died = type("ActorDiedError", (Exception,), {})
    err = actor_died("The actor died unexpectedly before finishing this task. class_name: MapWorker Worker exit "
                     "type: SYSTEM_ERROR Worker exit detail: Owner's node has crashed. The actor's node ...")
    line = extract.failure_line(err, 3)
    assert line.startswith("the Ray node of the job's driver died under an extract actor: Owner's node has crashed.")
    assert "4 time(s)" not in line and "--max-actors" in line


def test_the_batch_token_budget_sets_speed_not_the_runs_identity(no_ray, tmp_path, capsys):
    """A run resumed with another --batch-token-budget (another machine) is the same run; a setting
    that changes results is not; a negative budget is refused before Ray, naming the flag."""
    from jobs.config import from_args

    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)

    def config(*extra):
        return from_args(parser.parse_args(extract_args(SAMPLE, tmp_path / "out", *extra)))

    auto, big = config(), config("--batch-token-budget", 262144)
    assert auto.extract.decode.batch_token_budget == 0 and big.extract.decode.batch_token_budget == 262144
    assert auto.extract.run_id == big.extract.run_id
    compiled = config("--compile-layers", "on")  # speed only too
    assert compiled.extract.decode.compile_layers == "on" and auto.extract.decode.compile_layers == "auto"
    assert compiled.extract.run_id == auto.extract.run_id
    assert config("--max-value-tokens", 12).extract.run_id != auto.extract.run_id
    assert run_extract(extract_args(SAMPLE, tmp_path / "out", "--batch-token-budget", -1)) == 2
    assert "--batch-token-budget" in capsys.readouterr().err


def test_a_local_adapter_is_known_by_its_absolute_path(tmp_path, no_ray, monkeypatch):
    """--adapter was kept as typed (--input and --output made absolute): the same adapter typed
    relative, or from another working directory, was another job ("it differs in --adapter"), and
    the rows and report named the relative path. A job begun so resumes when its recorded path
    names this adapter from here, or its recorded files are this adapter's."""
    from jobs.config import from_args, run_id_for, typed_adapter
    from pipelines import commit

    adapter = tmp_path / "adapters" / "mine"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (tmp_path / "elsewhere").mkdir()
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)

    def plan(adapter_as_typed):
        args = parser.parse_args(["--input", str(SAMPLE), "--attributes", str(SAMPLE_ATTRIBUTES),
                                  "--output", str(tmp_path / "out"), "--adapter", adapter_as_typed])
        config = from_args(args)
        return config, checks.preflight(config, args)

    monkeypatch.chdir(tmp_path)
    config, first = plan("adapters/mine")
    assert config.extract.adapter_uri == str(adapter) == config.arguments["model"]["adapter_uri"]
    ungrouped = {**config.arguments, "read": {k: v for k, v in config.arguments["read"].items() if k != "group_chunks"}}
    assert run_id_for(typed_adapter(ungrouped, "adapters/mine")) in config.former_run_ids  # begun before 2026-11-29
    commit.claim_output(config.output.uri, config.output.run_id, first.arguments)
    monkeypatch.chdir(tmp_path / "elsewhere")
    for spelling in ("../adapters/mine", str(adapter), "../adapters/../adapters/mine/"):
        assert plan(spelling)[1].existing_run == config.output.run_id  # the same job: a resume

    # begun before the fix, from tmp_path, with the path recorded as typed
    old = typed_adapter(first.arguments, "adapters/mine")
    io.write_json(io.join(config.output.uri, "_job.json"),
                  {**io.read_json(io.join(config.output.uri, "_job.json")), "run_id": run_id_for(old), "arguments": old})
    for where, spelling in ((tmp_path, "adapters/mine"), (tmp_path, str(adapter)), (tmp_path / "elsewhere", "../adapters/mine")):
        monkeypatch.chdir(where)
        resumed = plan(spelling)[1]
        assert resumed.existing_run == resumed.run_id == run_id_for(old), (where, spelling)
    other = tmp_path / "elsewhere" / "adapters" / "mine"  # another adapter under the recorded spelling
    other.mkdir(parents=True)
    (other / "adapter_config.json").write_text('{"r": 8}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="it differs in --adapter"):
        plan("elsewhere/adapters/mine")
