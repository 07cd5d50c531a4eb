"""An extract actor process killed mid-run is restarted by Ray, its chunk retried, the job completes."""

import os
import signal
import threading

from pipelines import io

from .helpers import WAIT_SECONDS, catalog, check_exactly_once, commits, extract_args, jsonl, run_extract, wait_for


def test_extract_actor_killed_mid_run_is_retried(ray_cluster, tmp_path):
    records, valid = catalog(120)
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records))
    output = str(tmp_path / "out")
    # one actor; ~1 s of simulated decoding per chunk: the actor, not the writer, is the bottleneck, so after
    # two commits it is busy with a chunk and about ten are still to come
    argv = extract_args(source, output, "--chunk-rows", 10, "--dry-run-seconds-per-prompt", 0.1, "--max-actors", 1)
    outcome = {}
    job = threading.Thread(target=lambda: outcome.update(rc=run_extract(argv)))
    job.start()
    wait_for(lambda: len(commits(output)) >= 2, "the first commits")
    # the actor named in this job's commits (an earlier test's idle actor may still be alive)
    (actor,) = {io.read_json(uri)["stats"]["actor"] for uri in commits(output)}
    pid = int(actor.rsplit(":", 1)[1])
    assert pid in {p.pid for p in ray_cluster.workers("MapWorker(MapBatches(ExtractStage))")}
    os.kill(pid, signal.SIGKILL)
    job.join(timeout=WAIT_SECONDS)
    assert outcome.get("rc") == 0
    result = check_exactly_once(output, records, valid)
    assert result["extract_actor_processes"] == 2  # the killed actor and its restarted successor
