"""Assemble and run the Ray Data job: prepare (CPU tasks) -> extract (actor pool) -> write (CPU tasks).

```
shards ──id index (Ray tasks, once per output)──▶ per row: duplicate? already in an earlier output?      _dedup/
shards ──prepare_shards──▶ chunk rows ──ExtractStage (1 GPU / fractional CPU)──▶ results ──write_chunk──▶ files + commit
         read, validate,                 one chunk per call, decoder loaded                     attributes/, rejected/,
         apply verdicts, stack           once per actor                                         _commits/<shard>/<i>.json
```

Everything streams: no shuffle, no groupby, no materialize. The id index (pipelines/idindex.py) is
a map and a reduce over hash partitions of the product ids, in tasks of bounded memory, written
under the output before the first chunk and read again, not rebuilt, by a resumed run. The driver
plans shards, reads the commit listing, and sums each committed chunk's counters for progress and
the report.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import TextIO

import ray

from pipelines import attempts, commit, idindex, io, reader
from pipelines.devices import DEFAULT_DEVICE, DEVICES
from pipelines.dryrun import DRY_RUN, DryRunDecoder
from pipelines.extract_stage import ExtractConfig, ExtractStage
from pipelines.prepare import PrepareConfig, prepare_shards
from pipelines.progress import ProgressConfig, ProgressCounter, ProgressLine
from pipelines.report import ReportConfig, Stats, build_report, ensure_markdown, write_report

log = logging.getLogger("hpd.extract")


@dataclass(frozen=True)
class ResourceConfig:
    """How the job uses the cluster.

    io_cpus: CPUs each prepare/write task reserves (fractional, so they run beside the actors).
    cpu_actor_threads: torch threads per extract actor on a CPU-only cluster: one actor (and one
        model copy) per this many vCPUs. 1 by default: on a 2-vCPU Xeon two one-thread processes
        ran HPD 1.44x faster together than one process with two threads (docs/benchmarks.md). The
        actors together reserve half the cluster's CPUs in Ray's accounting, so that tasks always
        find room (a 2-core machine never deadlocks); ``max_actors`` caps them (fewer copies of the
        model in memory), and the threads then share all the vCPUs.
    cpu_actor_memory_gib: memory one CPU extract actor may take (its model, caches and batches: the
        default model's `hpd bench`, holding two models, peaked at 3.4 GiB); no more CPU actors
        than the cluster's Ray memory holds at this much each.
    gpu_actor_cpus: CPUs per extract actor beside its one GPU.
    max_actors: cap on the extract actor pool (default: one per GPU, or what the CPUs allow; never
        more than the job's chunks, see ``size_actors``).
    index: the id index's tasks (ids held per task, CPUs per task).
    prepare_tasks: prepare tasks at a time (default: one per extract actor, which keeps each fed,
        and never more than the job's shards); a cap, so that memory does not grow with the number
        of shards.
    write_tasks: write tasks at a time (default: one per extract actor; a chunk's write takes a
        small part of its extraction). Each task runs in its own worker process, so the cap bounds
        the processes (and their memory) the writes hold.
    tasks_in_flight_per_actor: chunks queued at each actor so the next is ready when one ends.
    store_chunks_per_actor: how many chunks (of up to ``chunk_bytes`` of input each, counted twice:
        a prepared chunk carries its records and their parsed fields) the job may hold in Ray's
        object store per extract actor, across all stages (see ``bound_object_store``).
    writes_per_worker: write tasks one worker process runs before Ray replaces it. A Ray worker's
        memory only grows (its heap, and the object store pages it has touched), so long runs
        recycle the processes of the task stages; a prepare task (a whole shard) always gets a
        fresh one.
    actor_restarts: how many times each extract actor is started again after its process died (a
        lost node, an out-of-memory kill, a crash) before the job stops with the cause; the chunk in
        hand is retried on the new process. Ray Data's own default restarts an actor without end, so
        an actor killed for memory on every chunk kept a job at 0% for as long as it was left to run.
    device: where the extract actors run. "auto": on the GPUs the cluster has when the job starts,
        else on its CPUs. "gpu": one GPU per actor, also on a cluster that has no GPU node yet (an
        autoscaling one that starts its GPU workers from zero): the job asks the autoscaler for
        ``max_actors`` GPUs (1 if not set, never more than the job's chunks) and waits up to
        ``gpu_wait_seconds`` for them, then runs on the GPUs there are (none: a clear error).
        "cpu": on CPUs, whatever GPUs there are.
    """

    io_cpus: float = 0.25
    cpu_actor_threads: int = 1
    cpu_actor_memory_gib: float = 3.0
    gpu_actor_cpus: float = 1.0
    max_actors: int | None = None
    index: idindex.IndexConfig = field(default_factory=idindex.IndexConfig)
    prepare_tasks: int | None = None
    write_tasks: int | None = None
    tasks_in_flight_per_actor: int = 2
    store_chunks_per_actor: int = 8
    writes_per_worker: int = 256
    actor_restarts: int = 3
    device: str = DEFAULT_DEVICE
    gpu_wait_seconds: float = 1800.0

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if not self.gpu_wait_seconds >= 0:
            raise ValueError(f"gpu_wait_seconds must be >= 0, got {self.gpu_wait_seconds}")
        if not isinstance(self.cpu_actor_threads, int) or self.cpu_actor_threads < 1:
            raise ValueError(f"cpu_actor_threads must be an int >= 1, got {self.cpu_actor_threads!r}")
        for name in ("io_cpus", "gpu_actor_cpus", "cpu_actor_memory_gib"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        optional = ("max_actors", "prepare_tasks", "write_tasks")  # None: sized from the cluster
        for name in (*optional, "tasks_in_flight_per_actor", "store_chunks_per_actor", "writes_per_worker"):
            value = getattr(self, name)
            if not (value is None and name in optional) and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.actor_restarts, int) or self.actor_restarts < 0:
            raise ValueError(f"actor_restarts must be an int >= 0, got {self.actor_restarts!r}")

    def object_store_bytes(self, actors: int, chunk_bytes: int) -> int:
        """The cap on the object store memory the job's chunks hold at once (``bound_object_store``)."""
        return actors * self.store_chunks_per_actor * 2 * chunk_bytes


@dataclass(frozen=True)
class ActorSizing:
    device: str  # "gpu" or "cpu"
    num_gpus: float  # per actor
    num_cpus: float  # per actor
    actors: int
    threads: int | None = None  # torch threads per CPU actor (None on GPU: torch's default)

    @property
    def devices(self) -> float:
        """Devices the pool computes on: GPUs, or on a CPU-only cluster the vCPUs its torch threads use."""
        return self.actors * (self.num_gpus if self.device == "gpu" else (self.threads or self.num_cpus))


def check_cluster(cluster: dict, config: ResourceConfig) -> None:
    """Refuse a cluster the extract actors cannot run on before any work is scheduled: one with no
    GPU and no CPU yet (a head started with 0 CPUs whose workers an autoscaler starts from zero),
    unless ``--device gpu`` asks the autoscaler for GPU nodes. Without this, ``--device auto`` saw no
    GPU and planned a CPU actor, for which the autoscaler would start a GPU node and leave its GPU
    idle (or, with no worker type that fits, the job waited forever)."""
    if config.device == "gpu" or cluster.get("GPU", 0) or cluster.get("CPU", 0):
        return
    raise ValueError("the cluster has no GPU and no CPU yet (its workers start from zero?): pass --device gpu, which "
                     "asks the autoscaler for GPU nodes and waits for them")


def size_actors(cluster: dict, config: ResourceConfig, chunks: int | None = None) -> ActorSizing:
    """One actor per GPU; without GPUs, one actor per ``cpu_actor_threads`` vCPUs but no more than
    the cluster's memory holds at ``cpu_actor_memory_gib`` each; their reservations leave half the
    CPUs to the tasks. Either way no more than ``max_actors`` nor ``chunks`` (the chunks the job has
    to do, when known): an actor without a chunk would load the model for nothing and hold its GPU,
    or leave its vCPUs idle where fewer actors with more threads each use them all."""
    gpus, cpus = int(cluster.get("GPU", 0)), float(cluster.get("CPU", 1))
    limits = ([config.max_actors] if config.max_actors else []) + ([max(1, chunks)] if chunks is not None else [])
    if config.device == "gpu" and not gpus:
        raise ValueError("--device gpu: the cluster has no GPU (an actor asking for one would wait forever)")
    if gpus and config.device != "cpu":
        return ActorSizing("gpu", 1, config.gpu_actor_cpus, min([gpus, *limits]))
    actors = min([max(1, int(cpus // config.cpu_actor_threads)), *limits])
    if "memory" in cluster:  # Ray's memory for tasks and actors, in bytes
        actors = min(actors, max(1, int(cluster["memory"] // (config.cpu_actor_memory_gib * 2**30))))
    # Ray would pin each actor to as many threads as its whole reserved CPUs (a fraction: 1); the
    # prepare and write tasks are light, so the actors' threads share all the cores for their matmuls.
    return ActorSizing("cpu", 0, cpus / 2 / actors, actors, threads=max(1, int(cpus // actors)))


def request_gpus(config: ResourceConfig, chunks: int, request=None) -> int:
    """Ask the autoscaler for the GPU nodes of ``min(max_actors or 1, chunks)`` actors, without
    waiting (``request``: Ray's ``request_resources`` by default, which replaces the cluster's
    earlier request); return how many."""
    if request is None:
        from ray.autoscaler.sdk import request_resources as request
    wanted = min(config.max_actors or 1, max(1, chunks))
    request(bundles=[{"GPU": 1, "CPU": config.gpu_actor_cpus}] * wanted)
    return wanted


def chunks_at_least(shards: list[reader.Shard], read: reader.ReadConfig) -> int:
    """A lower bound on a job's chunks before the id index has counted its rows: per shard one, or
    its bytes over ``chunk_bytes`` (a chunk closes at ``chunk_bytes`` or ``chunk_rows``, whichever
    comes first; a compressed file counts its compressed bytes), no more than its ``max_rows`` make."""
    total = 0
    for shard in shards:
        count = max(1, -(-(shard.end - shard.start) // read.chunk_bytes))
        if shard.max_rows is not None:
            count = min(count, max(1, -(-shard.max_rows // read.chunk_rows)))
        total += count
    return total


def await_gpus(config: ResourceConfig, chunks: int, resources=None, request=None, clock=time.monotonic,
               sleep=time.sleep) -> int:  # fmt: skip
    """``--device gpu``: ask the autoscaler for the GPUs the job will use (``max_actors``, 1 if not
    set, no more than ``chunks``) and wait until the cluster has them, at most ``gpu_wait_seconds``;
    then the GPUs there are. None after the wait is an error that says what to check. ``resources``
    and ``request`` default to Ray's (``ray.cluster_resources``, the autoscaler's
    ``request_resources``, a no-op on a cluster without an autoscaler)."""
    if resources is None:
        resources = ray.cluster_resources
    # the request now (it replaces the one before the index, which counted chunks by bytes and could
    # be larger), also when the GPUs are there already
    wanted = request_gpus(config, chunks, request)
    have = int(resources().get("GPU", 0))
    if have >= wanted:
        return have
    start = last_said = clock()
    log.info("--device gpu: waiting for %d GPU(s), %d in the cluster (at most %.0f s)", wanted, have, config.gpu_wait_seconds)
    while have < wanted and clock() - start < config.gpu_wait_seconds:
        sleep(min(5.0, config.gpu_wait_seconds))
        have = int(resources().get("GPU", 0))
        if clock() - last_said >= 60:
            last_said = clock()
            log.info("--device gpu: %d of %d GPU(s) after %.0f s", have, wanted, clock() - start)
    if not have:
        raise RuntimeError(f"--device gpu: no GPU joined the cluster in {config.gpu_wait_seconds:.0f} s: check that it "
                           "has a GPU worker type the autoscaler may start (its max_workers, the account's GPU quota)")
    if have < wanted:
        log.warning("--device gpu: %d of %d GPU(s) after %.0f s; running on those", have, wanted, clock() - start)
        # the pool is sized now: GPUs that joined later would sit idle, billed, until the job ends
        request_gpus(config, have, request)
    return have


def release_gpus(config: ResourceConfig) -> None:
    """Withdraw ``await_gpus``' request, so that the autoscaler may remove the nodes once idle."""
    if config.device == "gpu":
        from ray.autoscaler.sdk import request_resources

        try:
            request_resources(bundles=[])
        except Exception as err:  # the clean-up goes on; the message says what to do by hand
            log.warning("could not withdraw the request for GPUs (%s): the autoscaler keeps its nodes until "
                        "`ray.autoscaler.sdk.request_resources(bundles=[])` runs on this cluster", err)


def build_dataset(
    shards: list[dict],
    prepare: PrepareConfig,
    extract: ExtractConfig,
    output: commit.OutputConfig,
    sizing: ActorSizing,
    resources: ResourceConfig,
    counter=None,
) -> ray.data.Dataset:
    """The streaming pipeline; every stage sees one chunk per call (batch_size=1 over chunk rows).

    Every chunk is its own Ray Data block (``one_block_per_chunk``), so the actor pool takes chunks
    one by one, whichever actor is free, and no task buffers more than the chunk in hand.
    """
    ds = ray.data.from_items(shards, override_num_blocks=len(shards))
    ds = ds.map_batches(
        prepare_shards,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={"config": prepare},
        num_cpus=resources.io_cpus,
        # no more tasks than shards (Ray Data warns of a pool larger than its inputs)
        compute=ray.data.TaskPoolStrategy(size=max(1, min(resources.prepare_tasks or sizing.actors, len(shards)))),
        max_calls=1,
    )
    with warnings.catch_warnings():
        # max_restarts has no named parameter in Ray 2.60 (its ray_remote_args are deprecated, to go
        # in 2.64: pyproject pins ray < 2.64); the warning is nothing a user of the job can act on
        warnings.filterwarnings("ignore", message=".*ray_remote_args. is deprecated")
        ds = _extract_stage(ds, extract, sizing, resources, counter)
    return ds.map_batches(
        commit.write_chunk,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={"output": output},
        num_cpus=resources.io_cpus,
        compute=ray.data.TaskPoolStrategy(size=resources.write_tasks or sizing.actors),
        max_calls=resources.writes_per_worker,
    )


def _extract_stage(ds: ray.data.Dataset, extract: ExtractConfig, sizing: ActorSizing, resources: ResourceConfig,
                   counter) -> ray.data.Dataset:  # fmt: skip
    """The extract actor pool over the prepared chunks."""
    return ds.map_batches(
        ExtractStage,
        batch_size=1,
        batch_format="pyarrow",
        fn_constructor_kwargs={"config": extract, "threads": sizing.threads, "progress": counter},
        compute=ray.data.ActorPoolStrategy(
            size=sizing.actors, max_tasks_in_flight_per_actor=resources.tasks_in_flight_per_actor
        ),
        num_cpus=sizing.num_cpus,
        num_gpus=sizing.num_gpus,
        max_restarts=resources.actor_restarts,
    )


def _committed(manifests: tuple[str, ...], cpus: float, run_id: str) -> Stats:
    """The counters of chunks committed by earlier attempts of ``run_id``, read in parallel (no ids
    are kept)."""
    stats = Stats()
    if not manifests:
        return stats
    ds = ray.data.from_items([{"uri": uri} for uri in manifests]).map_batches(
        commit.committed_stats, batch_format="pyarrow", num_cpus=cpus, fn_kwargs={"run_id": run_id}
    )
    for row in ds.iter_rows():
        stats.add(json.loads(row["stats"]))
    return stats


def _stream(ds: ray.data.Dataset, line: ProgressLine, heartbeat: attempts.Heartbeat) -> Stats:
    """Drive the pipeline: sum each committed chunk's counters, feed the progress line; stop
    (``ValueError``) once another attempt has taken the output over (``Heartbeat.check``)."""
    stats = Stats()
    for row in ds.iter_rows():
        heartbeat.check()
        chunk = json.loads(row["stats"])
        stats.add(chunk)
        line.committed_chunk(row["chunk"], int(chunk["rows_in"]))
    return stats


NO_PROGRESS_TIMEOUT_ENV = "RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S"


def allow_slow_chunks() -> None:
    """A chunk (up to --chunk-rows products) is one actor call and may take longer than Ray Data's
    no-progress timeout (30 min in Ray 2.60) on a slow device: turn that timeout off unless the
    user set it. Liveness shows in the job's own progress log; failed actors are retried by Ray."""
    if NO_PROGRESS_TIMEOUT_ENV in os.environ:
        return
    context = ray.data.DataContext.get_current()
    if hasattr(context, "execution_no_progress_timeout_s"):
        context.execution_no_progress_timeout_s = -1


def one_block_per_chunk() -> None:
    """Close a Ray Data block after every row the stages yield: a row is a whole chunk (up to
    ``chunk_bytes``), so each chunk travels as its own block.

    Ray's default target (128 MiB) makes a prepare task buffer many chunks before it hands them
    on, so its memory grows with its shard. Splitting them afterwards (``repartition``) adds an
    operator whose tasks each reserve a whole CPU: on a 2-core machine beside a 1-CPU extract
    actor they ran only while no prepare task did, and a 10M-row run with 4 MiB blocks stalled
    after its first shard, its second prepare task idle with its outputs unread.
    """
    ray.data.DataContext.get_current().target_max_block_size = 1


def bound_object_store(limit_bytes: int) -> None:
    """Let the job's chunks hold at most ``limit_bytes`` of Ray's object store at once.

    Ray Data's default budget is half the object store (30% of a node's memory), and a prepare task
    reads its shard as fast as it can: over a long run it gets far ahead of the extract actors and
    the chunks waiting for them fill that budget. The pages of the object store's shared memory a
    process has touched stay in its memory (Ray never returns them), so the job's memory grew with
    the length of the run (+0.35 MiB per chunk read ahead, measured at 1M rows). A budget of a few chunks per
    actor keeps every actor fed and the memory flat.
    """
    context = ray.data.DataContext.get_current()
    context.execution_options.resource_limits = context.execution_options.resource_limits.copy(
        object_store_memory=limit_bytes)


def _meta(prepare: PrepareConfig, extract: ExtractConfig, output: commit.OutputConfig, skip_existing: str | None) -> dict:
    return {
        "run_id": output.run_id,
        "input": prepare.read.uri,
        "output": output.uri,
        "skip_existing": skip_existing,
        "decoder": extract.decoder,
        "model": DryRunDecoder.model_name if extract.decoder == DRY_RUN else extract.model_uri,
        "adapter": None if extract.decoder == DRY_RUN else extract.adapter_uri,
        "docs_per_prompt": prepare.stacking.docs_per_prompt,
        "chunk_rows": prepare.read.chunk_rows,
        "group_chunks": prepare.read.group_chunks,  # how the input was cut (1 for outputs started before 2026-11-29)
        "max_value_tokens": extract.decode.max_value_tokens,
        "spans_setting": extract.decode.spans,  # the report's "spans" says what ran
        "values_in_text": extract.values_in_text,
        "confidence": extract.decode.confidence,  # the attribute files have a confidence column
    }


def empty_job(
    *,
    prepare: PrepareConfig,
    extract: ExtractConfig,
    output: commit.OutputConfig,
    report: ReportConfig,
    skip_existing: str | None,
    arguments: dict,
    overwrite: bool = False,
) -> dict:
    """An input that holds no rows: a finished job of 0 products, recorded and reported without Ray
    (and without loading a model). ``overwrite``: first delete whatever the output holds, under a lease."""
    started = time.time()
    if overwrite:
        delete_under_lease(output.uri)
    commit.claim_output(output.uri, output.run_id, arguments)
    attempt = attempts.save(output.uri, attempts.Attempt(
        attempts.name_for(started), started, time.time(), "cpu", 0, report.price("cpu"), ended=True))
    result = build_report(_meta(prepare, extract, output, skip_existing), Stats(), Stats(), [attempt], attempt)
    write_report(output.uri, result)
    return result


def delete_under_lease(output_uri: str, heartbeat_seconds: float = attempts.HEARTBEAT_SECONDS) -> None:
    """Delete everything under ``output_uri`` while an attempt's record says this process works there
    (kept fresh during a long S3 delete), so an attempt that starts meanwhile gives way instead of
    losing its files; refused (``ValueError``) while another attempt runs there."""
    attempt = attempts.begin(output_uri, "cpu", 0, 0.0, time.time())
    heartbeat = attempts.Heartbeat(output_uri, attempt, heartbeat_seconds)  # alive while it waits (see begin_attempt)
    try:
        attempts.await_quiet(output_uri, attempt, heartbeat_seconds)
        commit.discard(output_uri, keep=attempts.record_uri(output_uri, attempt))
    finally:
        attempts.remove(output_uri, heartbeat.stop(write=False))


def run_job(
    *,
    prepare: PrepareConfig,
    extract: ExtractConfig,
    output: commit.OutputConfig,
    report: ReportConfig,
    resources: ResourceConfig,
    skip_existing: str | None,
    arguments: dict,
    progress: ProgressConfig = ProgressConfig(),
    stream: TextIO | None = None,
    overwrite: bool = False,
    started: float | None = None,
) -> dict:
    """Run (or resume) the whole job on the connected Ray cluster; return the report.

    A job that is already complete is not run again: its report is returned as it is. A run that
    fails (or is interrupted: Ctrl-C, SIGTERM) before any chunk of the job was committed leaves
    nothing behind, so a corrected command starts afresh (one killed outright leaves its claim and
    id index: the same command resumes, a corrected one is refused until --overwrite). Progress goes to ``stream`` (default stderr). ``overwrite``:
    first delete whatever the output holds (--overwrite), under this attempt's lease. ``started``:
    when the attempt began (before its driver started or joined Ray, which the attempt's time and
    cost include), now if not given."""
    started = time.time() if started is None else started
    allow_slow_chunks()
    one_block_per_chunk()
    resumed = False if overwrite else commit.claim_output(output.uri, output.run_id, arguments)
    heartbeat = begin_attempt(output, resources, report, progress, started, claimed=not overwrite)
    output = replace(output, attempt=heartbeat.attempt.name)  # its writers check its lease
    try:
        if overwrite:  # an attempt starting during the delete finds this one's record and gives way
            commit.discard(output.uri, keep=attempts.record_uri(output.uri, heartbeat.attempt))
            commit.claim_output(output.uri, output.run_id, arguments)
            commit.check_claim(output.uri, output.run_id)
        return _run(prepare, extract, output, report, resources, skip_existing, progress, stream or sys.stderr,
                    resumed, heartbeat)
    except BaseException:
        # a job that committed nothing leaves nothing behind (a corrected command may differ), unless
        # another attempt works on it now, or this one lost its lease (the output is another's now);
        # decided, and deleted, while this attempt's record still says it runs (an attempt starting
        # meanwhile gives way), the record itself last
        if (heartbeat.lost is None and attempts.lease_lost(output.uri, heartbeat.attempt.name) is None
                and not commit.scan(output.uri).manifests
                and not attempts.running(output.uri, heartbeat.attempt, progress.heartbeat_seconds)):
            commit.discard(output.uri, keep=attempts.record_uri(output.uri, heartbeat.attempt))
            attempts.remove(output.uri, heartbeat.stop(write=False))
        else:
            heartbeat.stop()
        raise


def begin_attempt(output: commit.OutputConfig, resources: ResourceConfig, report: ReportConfig,
                  progress: ProgressConfig, started: float, claimed: bool = True) -> attempts.Heartbeat:
    """Record this attempt and keep its record fresh: the output's lease (pipelines/attempts.py).
    Gives way (``ValueError``, its record removed) to another attempt running on the output (waiting
    out one whose record goes stale: a killed driver's), and
    (``claimed``) to another run that claimed the output beside this one."""
    device = "gpu" if resources.device == "gpu" else "cpu"  # "auto": decided, with the devices, once sized
    attempt = attempts.begin(output.uri, device, 0, report.price(device), started)
    # refreshed while it waits for another's record to show life or go stale: of two attempts started
    # together, each then sees the other refresh, and both give way (neither runs), as without the wait
    heartbeat = attempts.Heartbeat(output.uri, attempt, progress.heartbeat_seconds,
                                   also=lambda: commit.closed_reason(output.uri))
    try:
        attempts.await_quiet(output.uri, attempt, progress.heartbeat_seconds)
        attempts.check_lease(output.uri, attempt.name)  # another, starting beside it, may have waited it out
        if claimed:
            commit.check_claim(output.uri, output.run_id)
            commit.check_open(output.uri)  # after its record: a --skip-existing job closing it now sees it
    except BaseException:
        attempts.remove(output.uri, heartbeat.stop(write=False))
        raise
    return heartbeat


def _rows(shard: reader.Shard, index: idindex.ShardIndex) -> int:
    """A shard's rows, at most (``--limit`` may stop the job inside it)."""
    return min(index.rows, shard.max_rows or index.rows)


def _run(prepare, extract, output, report, resources, skip_existing, progress, stream, resumed, heartbeat) -> dict:
    state = commit.scan(output.uri) if resumed else commit.ResumeState()
    planned = reader.plan_shards(prepare.read)
    report_uri = io.join(output.uri, "_report.json")
    if all(state.complete(shard.shard_id) for shard in planned) and io.exists(report_uri):
        log.info("run %s is complete; nothing to do", output.run_id)
        attempts.remove(output.uri, heartbeat.stop())  # it did no work
        result = io.read_json(report_uri)
        ensure_markdown(output.uri, result)
        return result
    check_cluster(ray.cluster_resources(), resources)  # before the id index's tasks ask for CPUs
    try:  # from the request for GPUs on, withdrawn however the job ends (an autoscaler keeps a request)
        if resources.device == "gpu":  # its GPU nodes start while the index is built (on their CPUs)
            to_do = [shard for shard in planned if not state.complete(shard.shard_id)]
            request_gpus(resources, chunks_at_least(to_do, prepare.read))
        index = idindex.ensure_index(planned, prepare, output.uri, skip_existing, resources.index, bool(state.manifests),
                                     fence=lambda: commit.check_lease(output))
        heartbeat.check()
        todo = [(shard, shard_index) for shard, shard_index in zip(planned, index) if not state.complete(shard.shard_id)]
        shards = [
            dict(asdict(shard), skip=sorted(state.done.get(shard.shard_id, ())), index=idindex.to_json(shard_index))
            for shard, shard_index in todo
        ]
        # chunks to do, at least (a chunk also closes at chunk_bytes; a resumed shard's committed chunks
        # are not done again): no more actors, nor tasks that write, than that
        chunks = sum(max(1, -(-_rows(shard, idx) // prepare.read.chunk_rows) - len(state.done.get(shard.shard_id, ())))
                     for shard, idx in todo)
        if resources.device == "gpu":
            await_gpus(resources, chunks)
        sizing = size_actors(ray.cluster_resources(), resources, chunks=chunks)
        bound_object_store(resources.object_store_bytes(sizing.actors, prepare.read.chunk_bytes))
        log.info("run %s: %d shards to do, %d chunks already committed; %d %s actor(s)", output.run_id,
                 len(shards), len(state.manifests), sizing.actors, sizing.device)
        rows = sum(_rows(shard, idx) for shard, idx in todo)  # less when resumed
        extract = extract.sized_for(rows / sizing.actors)
        heartbeat.sized(sizing.device, sizing.devices, report.price(sizing.device))
        counter = ProgressCounter.remote()
        try:
            previous = _committed(state.manifests, resources.io_cpus, output.run_id)
            this_run = Stats()
            if shards:
                total = sum(_rows(shard, idx) for shard, idx in zip(planned, index))
                line = ProgressLine(counter, planned, prepare.read, previous.counts["rows_in"], stream, progress, total)
                line.start()
                finished = False
                try:
                    ds = build_dataset(shards, prepare, extract, output, sizing, resources, counter)
                    this_run = _stream(ds, line, heartbeat)
                    finished = True
                finally:
                    line.stop(final=finished)
        finally:
            release_gpus(resources)  # first: a slow or failed clean-up must not keep the GPU nodes up
            ray.kill(counter)
            attempt = heartbeat.stop()
        heartbeat.check()  # the report is the owner's to write
        total = previous.merged(this_run)
        meta = _meta(prepare, extract, output, skip_existing)
        result = build_report(meta, total, this_run, attempts.load_all(output.uri), attempt,
                              schema_categories=extract.schema.categories)
        write_report(output.uri, result)
        return result
    finally:
        release_gpus(resources)
