"""Job configuration and cluster sizing (no Ray needed)."""

import argparse
import re
from dataclasses import replace

import pytest

from jobs import extract
from jobs.config import from_args, run_id_for
from pipelines.build import ResourceConfig, await_gpus, size_actors
from pipelines.extract_stage import COMPILE_MIN_PRODUCTS_PER_ACTOR

from .helpers import SAMPLE, SAMPLE_ATTRIBUTES, run_extract

BASE = ["--input", SAMPLE, "--attributes", SAMPLE_ATTRIBUTES]


def parse(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    return parser.parse_args(["--input", str(SAMPLE), "--attributes", str(SAMPLE_ATTRIBUTES), *map(str, argv)])


@pytest.mark.parametrize(
    "cluster, config, expected",
    [
        ({"GPU": 8, "CPU": 192}, ResourceConfig(), ("gpu", 1, 1.0, 8)),
        ({"GPU": 8, "CPU": 192}, ResourceConfig(max_actors=2), ("gpu", 1, 1.0, 2)),
        ({"CPU": 2}, ResourceConfig(), ("cpu", 0, 0.5, 2)),  # one per vCPU; half the CPUs stay free for tasks
        ({"CPU": 1}, ResourceConfig(), ("cpu", 0, 0.5, 1)),
        ({"CPU": 16}, ResourceConfig(), ("cpu", 0, 0.5, 16)),
        ({"CPU": 16}, ResourceConfig(cpu_actor_threads=4), ("cpu", 0, 2.0, 4)),
        ({"CPU": 16}, ResourceConfig(max_actors=2), ("cpu", 0, 4.0, 2)),
    ],
)
def test_actor_sizing(cluster, config, expected):
    sizing = size_actors(cluster, config)
    assert (sizing.device, sizing.num_gpus, sizing.num_cpus, sizing.actors) == expected
    assert sizing.num_cpus <= cluster["CPU"] / 2 or sizing.device == "gpu"


def test_device_cpu_ignores_gpus_and_device_gpu_needs_one():
    cpu = size_actors({"GPU": 8, "CPU": 16}, ResourceConfig(device="cpu"))
    assert (cpu.device, cpu.num_gpus, cpu.actors) == ("cpu", 0, 16)
    gpu = size_actors({"GPU": 2, "CPU": 16}, ResourceConfig(device="gpu", max_actors=4))
    assert (gpu.device, gpu.num_gpus, gpu.actors) == ("gpu", 1, 2)
    with pytest.raises(ValueError, match="--device gpu: the cluster has no GPU"):
        size_actors({"CPU": 16}, ResourceConfig(device="gpu"))
    with pytest.raises(ValueError, match="device must be one of"):
        ResourceConfig(device="tpu")


class Cluster:
    """The GPUs a scripted autoscaling cluster has at each look, and what it was asked for."""

    def __init__(self, gpus: list[int]):
        self.gpus, self.asked, self.now = list(gpus), [], 0.0

    def resources(self) -> dict:
        return {"CPU": 4.0, "GPU": float(self.gpus.pop(0) if len(self.gpus) > 1 else self.gpus[0])}

    def request(self, bundles):
        self.asked.append(bundles)

    def sleep(self, seconds):
        self.now += seconds


def await_with(cluster: Cluster, config: ResourceConfig, chunks: int = 100) -> int:
    return await_gpus(config, chunks, cluster.resources, cluster.request, clock=lambda: cluster.now, sleep=cluster.sleep)


def test_device_gpu_asks_an_autoscaling_cluster_for_its_gpus_and_waits():
    """A cluster whose GPU workers start from zero: before --device gpu the job sized CPU actors
    from the GPU-less cluster it saw at the start and never asked for a GPU."""
    cluster = Cluster([0, 0, 0, 1, 3])
    assert await_with(cluster, ResourceConfig(device="gpu", max_actors=3)) == 3
    assert cluster.asked == [[{"GPU": 1, "CPU": 1.0}] * 3] and cluster.now == 20.0
    assert await_with(Cluster([0, 1]), ResourceConfig(device="gpu"), chunks=5) == 1  # 1 GPU unless --max-actors
    few = Cluster([0, 1])
    assert await_with(few, ResourceConfig(device="gpu", max_actors=8), chunks=2) == 1  # no more than the chunks
    assert few.asked == [[{"GPU": 1, "CPU": 1.0}] * 2, [{"GPU": 1, "CPU": 1.0}]]  # then only what it runs on
    part = Cluster([0, 1])  # never more than one: after the wait, run on it
    assert await_with(part, ResourceConfig(device="gpu", max_actors=4, gpu_wait_seconds=30)) == 1 and part.now >= 30
    assert part.asked == [[{"GPU": 1, "CPU": 1.0}] * 4, [{"GPU": 1, "CPU": 1.0}]]  # later GPUs would sit idle
    with pytest.raises(RuntimeError, match="no GPU joined the cluster in 30 s: check"):
        await_with(Cluster([0]), ResourceConfig(device="gpu", gpu_wait_seconds=30))
    present = Cluster([2])
    assert await_with(present, ResourceConfig(device="gpu", max_actors=2)) == 2
    assert present.asked == [[{"GPU": 1, "CPU": 1.0}] * 2]  # replaces a larger request made before the index


def test_cpu_actors_share_all_cores_for_torch_threads():
    assert size_actors({"CPU": 2}, ResourceConfig()).threads == 1  # 2 actors, one thread each
    assert size_actors({"CPU": 2}, ResourceConfig(cpu_actor_threads=2)).threads == 2  # 1 actor
    assert size_actors({"CPU": 16}, ResourceConfig(cpu_actor_threads=2)).threads == 2  # 8 actors
    assert size_actors({"CPU": 16}, ResourceConfig(max_actors=2)).threads == 8
    assert size_actors({"CPU": 1}, ResourceConfig()).threads == 1
    with pytest.raises(ValueError, match="cpu_actor_threads"):
        ResourceConfig(cpu_actor_threads=0)


def test_no_more_actors_than_chunks_to_do():
    """A job of one chunk gets one CPU actor with every thread, not one busy actor and idle ones;
    on GPUs, one actor (one model load, one GPU held) per chunk at most."""
    one = size_actors({"CPU": 2}, ResourceConfig(), chunks=1)
    assert (one.actors, one.threads, one.num_cpus) == (1, 2, 1.0)
    assert size_actors({"CPU": 16}, ResourceConfig(), chunks=3).actors == 3
    assert size_actors({"CPU": 16}, ResourceConfig(), chunks=3).threads == 5
    assert size_actors({"CPU": 2}, ResourceConfig(), chunks=10).actors == 2
    assert size_actors({"GPU": 8, "CPU": 192}, ResourceConfig(), chunks=1).actors == 1
    assert size_actors({"GPU": 8, "CPU": 192}, ResourceConfig(), chunks=20).actors == 8  # one per GPU
    assert size_actors({"GPU": 8, "CPU": 192}, ResourceConfig(max_actors=2), chunks=5).actors == 2


def test_no_more_cpu_actors_than_the_memory_holds():
    gib = 2**30
    small = size_actors({"CPU": 16, "memory": 8 * gib}, ResourceConfig())  # 3 GiB each: 2 actors
    assert (small.actors, small.threads) == (2, 8)
    assert size_actors({"CPU": 2, "memory": 15 * gib}, ResourceConfig()).actors == 2
    assert size_actors({"CPU": 4, "memory": 1 * gib}, ResourceConfig()).actors == 1  # always one
    assert size_actors({"CPU": 16, "memory": 8 * gib}, ResourceConfig(cpu_actor_memory_gib=1)).actors == 8
    with pytest.raises(ValueError, match="cpu_actor_memory_gib"):
        ResourceConfig(cpu_actor_memory_gib=0)
    assert size_actors({"GPU": 8, "CPU": 192}, ResourceConfig()).threads is None  # torch's default


@pytest.mark.parametrize("field", ["write_tasks", "prepare_tasks", "store_chunks_per_actor", "writes_per_worker",
                                   "tasks_in_flight_per_actor"])
def test_task_caps_must_be_positive(field):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        ResourceConfig(**{field: 0})


def test_object_store_budget_is_a_few_chunks_per_actor():
    # 8 chunks of up to 16 MiB input, counted twice (records + parsed fields), per extract actor
    assert ResourceConfig().object_store_bytes(actors=1, chunk_bytes=16 << 20) == 256 << 20
    assert ResourceConfig().object_store_bytes(actors=8, chunk_bytes=16 << 20) == 2 << 30
    assert ResourceConfig(store_chunks_per_actor=2).object_store_bytes(actors=1, chunk_bytes=1 << 20) == 4 << 20


def test_defaults_come_from_the_dataclasses_and_run_id_is_stable(tmp_path):
    config = from_args(parse("--output", tmp_path / "out"))
    assert config.prepare.stacking.docs_per_prompt == 4 and config.extract.decode.max_value_tokens == 30
    assert config.report.price("gpu") == 3.77 and config.report.price("cpu") == 0.0425
    assert config.prepare.validation.oversize == "truncate"
    assert config.extract.decoder == "hpd" and config.extract.model_uri == "default"
    again = from_args(parse("--output", tmp_path / "out", "--price-per-hour", 9, "--address", "local"))
    assert again.output.run_id == config.output.run_id  # price and address do not change the rows
    other = from_args(parse("--output", tmp_path / "out", "--docs-per-prompt", 2))
    assert other.output.run_id != config.output.run_id
    assert config.extract.decode.step_shape == "auto"
    packed = from_args(parse("--output", tmp_path / "out", "--step-shape", "packed"))
    assert packed.extract.decode.step_shape == "packed"  # part of the identity: in bf16 the rounding may differ
    assert packed.output.run_id != config.output.run_id
    assert "confidence" not in config.arguments["decode"]  # off: the identity of every job before the option
    sure = from_args(parse("--output", tmp_path / "out", "--confidence"))
    assert sure.extract.decode.confidence and sure.arguments["decode"]["confidence"] is True
    assert sure.output.run_id != config.output.run_id  # another column in its files


def test_an_output_started_with_a_typed_default_before_resumes_under_its_own_id(tmp_path):
    """Until 2026-11-29 a typed --model default was part of the identity: such an output, resumed
    with the same command, is the same job under the run id it was started with."""
    from jobs.checks import preflight
    from pipelines import commit

    args = parse("--output", tmp_path / "out", "--model", "default", "--decoder", "dry-run")
    config = from_args(args)
    then = {**config.arguments, "model": {"model_uri": "default"}}  # the identity then: typed, chunks of consecutive rows
    then["read"] = {k: v for k, v in then["read"].items() if k != "group_chunks"}
    former = run_id_for(then)
    assert former in config.former_run_ids and former != config.output.run_id
    commit.claim_output(config.output.uri, former, then)
    args.overwrite = False
    plan = preflight(config, args)
    assert plan.run_id == former == plan.existing_run  # a resume, not another job
    assert config.as_run(plan.run_id).extract.run_id == config.as_run(plan.run_id).output.run_id == former
    assert config.as_run(plan.run_id).prepare.read.group_chunks == 1  # read as it was then


def test_an_output_started_before_grouping_resumes_reading_chunks_as_then(tmp_path):
    """Until 2026-11-29 chunks were consecutive rows (group_chunks 1, not part of the identity). The
    same command now, with the default grouping, resumes such an output under its id and cuts its
    input as then (another cut would misalign its committed chunks); --group-chunks 1 typed is that
    same job; another --group-chunks is another job."""
    from jobs.checks import preflight
    from pipelines import commit

    args = parse("--output", tmp_path / "out", "--decoder", "dry-run")
    config = from_args(args)
    assert config.prepare.read.group_chunks == 8 and config.arguments["read"]["group_chunks"] == 8
    ungrouped = from_args(parse("--output", tmp_path / "out", "--decoder", "dry-run", "--group-chunks", "1"))
    assert "group_chunks" not in ungrouped.arguments["read"] and ungrouped.output.run_id in config.former_run_ids
    assert from_args(parse("--output", tmp_path / "out", "--decoder", "dry-run", "--group-chunks", "3")).former_runs == ()
    commit.claim_output(config.output.uri, ungrouped.output.run_id, ungrouped.arguments)
    args.overwrite = False
    plan = preflight(config, args)
    assert plan.run_id == ungrouped.output.run_id == plan.existing_run
    resumed = config.as_run(plan.run_id)
    assert resumed.prepare.read.group_chunks == 1 and resumed.output.run_id == ungrouped.output.run_id
    assert config.as_run(config.output.run_id).prepare.read.group_chunks == 8  # its own id: as configured
    args.overwrite = True  # starting over is today's job, cut as configured, under today's id
    fresh = preflight(config, args)
    assert fresh.run_id == config.output.run_id != ungrouped.output.run_id


def test_another_group_chunks_is_refused_naming_both_values(tmp_path):
    """A job begun with the default --group-chunks (8) is another job than --group-chunks 1: the
    refusal names both values, 1 too (the identity leaves 1 out; it said "here: not given")."""
    from jobs.checks import preflight
    from pipelines import commit

    grouped = from_args(parse("--output", tmp_path / "out", "--decoder", "dry-run"))
    commit.claim_output(grouped.output.uri, grouped.output.run_id, grouped.arguments)
    args = parse("--output", tmp_path / "out", "--decoder", "dry-run", "--group-chunks", "1")
    args.overwrite = False
    with pytest.raises(ValueError, match=re.escape("it differs in --group-chunks (there: 8; here: 1).")):
        preflight(from_args(args), args)
    ungrouped = from_args(parse("--output", tmp_path / "other", "--decoder", "dry-run", "--group-chunks", "1"))
    commit.claim_output(ungrouped.output.uri, ungrouped.output.run_id, ungrouped.arguments)
    args = parse("--output", tmp_path / "other", "--decoder", "dry-run", "--docs-per-prompt", "2")  # another job
    args.overwrite = False
    with pytest.raises(ValueError, match=re.escape("--group-chunks (there: 1; here: 8)")):
        preflight(from_args(args), args)


def test_typing_a_default_model_or_dtype_is_the_same_job(tmp_path):
    """--model default or --dtype auto, typed, give the run id of leaving them out (before, a job
    resumed with the default typed was refused as a different job); another dtype is another job."""
    run_id = lambda *argv: from_args(parse("--output", tmp_path / "out", *argv)).output.run_id  # noqa: E731
    plain = run_id()
    assert run_id("--model", "default") == run_id("--dtype", "auto") == run_id("--model", "default", "--dtype", "auto") == plain
    assert run_id("--dtype", "bfloat16") != plain and run_id("--model", "smollm2-135m-hpd") != plain


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--output", SAMPLE.parent], "must not contain one another"),
        (["--output", "x", "--docs-per-prompt", 0], "^--docs-per-prompt must be a positive int, got 0$"),
        (["--output", "x", "--max-value-tokens", 0], "^--max-value-tokens must be"),
        (["--output", "x", "--limit", 0], "^--limit must be"),
        (["--output", "x", "--max-text-chars", -1], "^--max-text-chars must be"),
        (["--output", "x", "--chunk-rows", 0], "^--chunk-rows must be"),
        (["--output", "x", "--price-per-hour", -1], "^--price-per-hour must be"),
        (["--output", "x", "--dry-run-seconds-per-prompt", -1], "^--dry-run-seconds-per-prompt must be"),
        (["--output", "x", "--model", "s3://b/m", "--dtype", "float32", "--max-actors", 0], "^--max-actors must be"),
        (["--output", "ftp://host/x"], "unsupported URI scheme"),
        (["--output", "x", "--spans", "--decoder", "dry-run"], "^--spans must go with --decoder hpd or ar or reference, got dry-run$"),
        (["--output", "x", "--confidence", "--decoder", "ar"], "^--confidence must go with --decoder hpd or reference, got ar$"),
        (["--output", "x", "--confidence", "--decoder", "dry-run"], "^--confidence must go with --decoder hpd or reference, got dry-run$"),
    ],
)
def test_bad_arguments_are_clear_value_errors(argv, message, tmp_path):
    argv = [a if a != "x" else tmp_path / "out" for a in argv]
    with pytest.raises(ValueError, match=message):
        from_args(parse(*argv))


@pytest.mark.parametrize(
    "argv, spans",
    [([], "auto"), (["--spans"], "on"), (["--spans", "on"], "on"), (["--spans", "off"], "off"),
     (["--decoder", "dry-run"], "auto")],  # auto: the dry run decodes no spans, and is no error
)
def test_span_decoding_is_auto_unless_asked(argv, spans, tmp_path):
    config = from_args(parse("--output", tmp_path / "out", *argv))
    assert config.extract.decode.spans == spans and config.arguments["decode"]["spans"] == spans


@pytest.mark.parametrize("setting", ["auto", "on", "off"])
def test_small_jobs_leave_compile_layers_auto_eager(setting, tmp_path):
    config = from_args(parse("--output", tmp_path / "out", "--compile-layers", setting)).extract
    small = config.sized_for(COMPILE_MIN_PRODUCTS_PER_ACTOR - 1)
    large = config.sized_for(COMPILE_MIN_PRODUCTS_PER_ACTOR)
    assert small.decode.compile_layers == ("off" if setting == "auto" else setting)  # asked for: kept
    assert large is config  # a job large enough keeps what was asked, auto included
    assert replace(small, decode=config.decode) == config  # nothing else changes


def test_cli_reports_config_errors_without_starting_ray(tmp_path, capsys):
    assert run_extract(BASE + ["--output", tmp_path / "out", "--docs-per-prompt", 0]) == 2
    err = capsys.readouterr().err
    assert "--docs-per-prompt must be" in err and "docs_per_prompt" not in err  # the flag, not the field


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "/nope/model"], "model directory /nope/model does not exist"),
        (["--model", "./nope.gguf"], "GGUF file ./nope.gguf does not exist"),
        (["--adapter", "/nope/adapter"], "adapter /nope/adapter does not exist (give a LoRA adapter's directory"),
        (["--adapter", "{tmp}"], "adapter {tmp} is not a PEFT adapter directory (no adapter_config.json)"),
    ],
)
def test_cli_reports_missing_model_paths_without_starting_ray(extra, message, tmp_path, capsys, monkeypatch):
    import ray

    import pipelines.build

    def must_not_run(*args, **kwargs):
        raise AssertionError("the job started although a model path is missing")

    monkeypatch.setattr(ray, "init", must_not_run)
    monkeypatch.setattr(pipelines.build, "run_job", must_not_run)
    extra = [str(arg).format(tmp=tmp_path) for arg in extra]  # {tmp}: a folder that exists, holding no adapter
    assert run_extract(BASE + ["--output", tmp_path / "out", *extra]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


def test_slow_chunks_do_not_trip_ray_datas_no_progress_timeout(monkeypatch):
    import ray

    from pipelines.build import NO_PROGRESS_TIMEOUT_ENV, allow_slow_chunks

    context = ray.data.DataContext.get_current()
    monkeypatch.setattr(context, "execution_no_progress_timeout_s", 1800)
    monkeypatch.setenv(NO_PROGRESS_TIMEOUT_ENV, "600")
    allow_slow_chunks()
    assert context.execution_no_progress_timeout_s == 1800  # the user's choice is kept
    monkeypatch.delenv(NO_PROGRESS_TIMEOUT_ENV)
    allow_slow_chunks()
    assert context.execution_no_progress_timeout_s == -1  # a chunk may take longer than 30 min


def test_a_cluster_with_nothing_to_run_on_is_refused_unless_gpus_are_asked_for():
    from pipelines.build import check_cluster

    for device in ("auto", "cpu"):
        with pytest.raises(ValueError, match="no GPU and no CPU yet .*pass --device gpu"):
            check_cluster({"memory": 1e9}, ResourceConfig(device=device))  # a 0-CPU head, no workers yet
        with pytest.raises(ValueError, match="no GPU and no CPU yet"):
            check_cluster({"CPU": 0.0}, ResourceConfig(device=device))
    check_cluster({"memory": 1e9}, ResourceConfig(device="gpu"))  # it asks the autoscaler and waits
    check_cluster({"CPU": 2.0}, ResourceConfig())
    check_cluster({"GPU": 1.0}, ResourceConfig())


def test_gpus_are_asked_for_before_the_index_by_a_lower_bound_on_the_chunks():
    from pipelines.build import chunks_at_least, request_gpus
    from pipelines.reader import ReadConfig, Shard

    read = ReadConfig(uri="in", chunk_rows=100, chunk_bytes=1000)
    shards = [Shard("a", "a", "jsonl", 0, 10), Shard("b", "b", "jsonl", 0, 3500), Shard("c", "c", "parquet", 0, 99_000, 150)]
    assert chunks_at_least(shards, read) == 1 + 4 + 2  # a small file is a chunk; bytes / chunk_bytes; --limit caps
    asked = []
    assert request_gpus(ResourceConfig(device="gpu", max_actors=8), 7, lambda bundles: asked.append(bundles)) == 7
    assert request_gpus(ResourceConfig(device="gpu"), 7, lambda bundles: asked.append(bundles)) == 1
    assert asked == [[{"GPU": 1, "CPU": 1.0}] * 7, [{"GPU": 1, "CPU": 1.0}]]


def test_gpus_are_asked_for_before_the_index_and_withdrawn_when_it_fails(ray_cluster, tmp_path, monkeypatch):
    """--device gpu on a cluster that has no GPU: the request goes out before the id index is built
    (its nodes' CPUs build it), and an index that fails withdraws it (bundles=[]), so no GPU node
    stays up for a job that has stopped."""
    import ray.autoscaler.sdk

    import pipelines.build
    from jobs.config import from_args
    from pipelines import idindex

    calls = []
    monkeypatch.setattr(ray.autoscaler.sdk, "request_resources", lambda bundles: calls.append(("request", bundles)))

    def failing_index(*args, **kwargs):
        calls.append(("index", None))
        raise OSError("the store went away")

    monkeypatch.setattr(idindex, "ensure_index", failing_index)
    config = from_args(parse("--output", tmp_path / "out", "--device", "gpu", "--max-actors", 4))
    with pytest.raises(OSError, match="the store went away"):
        pipelines.build.run_job(prepare=config.prepare, extract=config.extract, output=config.output,
                                report=config.report, resources=config.resources, skip_existing=None,
                                arguments=config.arguments)
    assert calls == [("request", [{"GPU": 1, "CPU": 1.0}]), ("index", None), ("request", [])]


def test_an_output_inside_the_input_through_a_symbolic_link_is_refused(tmp_path):
    """A later job on the input would read the output's own Parquet files as records."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.jsonl").write_text('{"product_id": "p", "category": "Shoes", "title": "t"}\n')
    (tmp_path / "link").symlink_to(source)
    args = parse("--output", tmp_path / "link" / "out")
    args.input = str(source)
    with pytest.raises(ValueError, match="must not contain one another"):
        from_args(args)
    args.output = str(tmp_path / "elsewhere")
    assert from_args(args).output.uri.endswith("elsewhere")  # a path beside it is fine
