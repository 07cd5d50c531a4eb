"""The report describes the whole job: time and cost summed over attempts, each at its device's price."""

import re
import time

import pytest

from pipelines import attempts, io
from pipelines.build import ActorSizing
from pipelines import report as report_module
from pipelines.report import ReportConfig, Stats, build_report, render_markdown, write_report

META = {"run_id": "r", "input": "in", "output": "out", "decoder": "hpd", "model": "default", "adapter": None,
        "docs_per_prompt": 4, "max_value_tokens": 30}


def stats(products: int, decode_seconds: float = 1.0) -> Stats:
    total = Stats()
    total.add({"rows_in": products, "products_out": products, "decode_seconds": decode_seconds})
    return total


def test_prices_per_device_kind():
    assert ReportConfig().price("gpu") == 3.77 and ReportConfig().price("cpu") == 0.0425
    assert ReportConfig(price_per_hour=1.5).price("gpu") == ReportConfig(price_per_hour=1.5).price("cpu") == 1.5
    with pytest.raises(ValueError, match="price_per_hour must be >= 0"):
        ReportConfig(price_per_hour=-1)


def test_cpu_devices_are_the_vcpus_the_actors_compute_on():
    assert ActorSizing("cpu", 0, 1.0, 1, threads=2).devices == 2  # 1 actor, 2 torch threads
    assert ActorSizing("gpu", 1, 1.0, 8).devices == 8


def test_report_sums_attempts_and_prices_each_by_its_device(tmp_path):
    first = attempts.Attempt("a", 0.0, 100.0, "cpu", 2, ReportConfig().price("cpu"))  # killed after 100 s
    second = attempts.Attempt("b", 500.0, 560.0, "cpu", 2, ReportConfig().price("cpu"))
    report = build_report(META, stats(300, 90.0), stats(100, 30.0), [first, second], second)
    assert report["attempts"] == 2 and report["resumed"]
    assert report["wall_seconds"] == 160.0 and report["device_seconds"] == 320.0  # not the 60 s of this run
    assert report["usd"] == pytest.approx(320 / 3600 * 0.0425, abs=1e-6)
    assert report["usd_per_1k_products"] == pytest.approx(320 / 3600 * 0.0425 / 300 * 1000, abs=1e-6)
    assert report["products_per_second_per_device"] == pytest.approx(300 / 320, abs=1e-3)
    assert report["this_run"]["wall_seconds"] == 60.0 and report["this_run"]["products_out"] == 100
    assert report["price_per_hour"] == 0.0425 and report["price_unit"] == "vCPU-hour"
    text = render_markdown(report)
    assert "Whole job (2 attempts, resumed): 300 products in 160.0 s, 320.0 vCPU-seconds" in text
    assert "per vCPU-hour" in text

    gpu = attempts.Attempt("c", 600.0, 636.0, "gpu", 1, ReportConfig().price("gpu"))
    mixed = build_report(META, stats(400), stats(100), [first, second, gpu], gpu)
    assert mixed["device"] == "cpu+gpu" and mixed["cpu_seconds"] == 320.0 and mixed["gpu_seconds"] == 36.0
    assert mixed["usd"] == pytest.approx(320 / 3600 * 0.0425 + 36 / 3600 * 3.77, abs=1e-6)
    assert mixed["products_per_second_per_device"] is None  # GPU-seconds and vCPU-seconds do not add up


def test_busy_seconds_are_device_seconds_as_the_whole_jobs_are():
    """An actor of two torch threads busy for 30 s used 60 vCPU-seconds, in the same unit as the
    job's device_seconds beside it; a GPU actor's chunk counts its one GPU, and a chunk committed
    before the device count was recorded counts one device (resumed jobs)."""
    total = Stats()
    total.add({"rows_in": 3, "products_out": 3, "decode_seconds": 30.0, "decode_devices": 2})
    total.add({"rows_in": 1, "products_out": 1, "decode_seconds": 5.0})  # an older manifest's chunk
    attempt = attempts.Attempt("a", 0.0, 100.0, "cpu", 2, 0.0425)
    report = build_report(META, total, total, [attempt], attempt)
    assert report["busy_device_seconds"] == 65.0 and report["this_run"]["busy_device_seconds"] == 65.0
    assert "200.0 vCPU-seconds (65.0 of them busy decoding)" in render_markdown(report)
    assert total.merged(total).busy_device_seconds == 130.0


def test_the_report_names_the_dtype_the_models_ran_in():
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, 0.0425)
    bf16, f32, dry = Stats(), Stats(), Stats()
    bf16.add({"rows_in": 2, "products_out": 2, "dtype": "bfloat16"})
    bf16.add({"rows_in": 1, "products_out": 1, "dtype": "bfloat16"})
    f32.add({"rows_in": 1, "products_out": 1, "dtype": "float32"})
    dry.add({"rows_in": 1, "products_out": 1, "dtype": None})  # the dry run loads no model
    report = build_report(META, bf16, bf16, [attempt], attempt)
    assert report["dtype"] == "bfloat16" and "dtype: bfloat16" in render_markdown(report)
    assert build_report(META, bf16.merged(f32), f32, [attempt], attempt)["dtype"] == "bfloat16+float32"  # resumed elsewhere
    assert build_report(META, dry, dry, [attempt], attempt)["dtype"] is None
    assert "dtype" not in render_markdown(build_report(META, dry, dry, [attempt], attempt))


def test_the_report_says_when_values_carry_a_confidence():
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, 0.0425)
    stats = Stats()
    stats.add({"rows_in": 1, "products_out": 1})
    assert "confidence" not in render_markdown(build_report(META, stats, stats, [attempt], attempt))
    sure = build_report(dict(META, confidence=True), stats, stats, [attempt], attempt)
    assert sure["confidence"] is True and "confidence: on" in render_markdown(sure)


@pytest.mark.parametrize("field, shown", [("spans", "spans"), ("compiled", "compiled layers")])
def test_the_report_names_what_ran_per_actor(field, shown):
    """Span decoding (--spans auto) and the compiled layers (--compile-layers auto), resolved per
    actor: on, off, both for a job resumed elsewhere (on a GPU, or eagerly), none for the dry run."""
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, 0.0425)
    on, off, dry = Stats(), Stats(), Stats()
    on.add({"rows_in": 2, "products_out": 2, field: True})
    off.add({"rows_in": 1, "products_out": 1, field: False})
    dry.add({"rows_in": 1, "products_out": 1, field: None})  # the dry run runs no model
    report = build_report(META, on, on, [attempt], attempt)
    assert report[field] == "on" and f"{shown}: on" in render_markdown(report)
    assert build_report(META, on.merged(off), off, [attempt], attempt)[field] == "off+on"
    assert build_report(META, dry, dry, [attempt], attempt)[field] is None
    assert f"{shown}:" not in render_markdown(build_report(META, dry, dry, [attempt], attempt))


def test_products_per_prompt_counts_the_products_of_failed_prompts_too():
    """A prompt that failed stacked its products as well (rejected at the extract stage): they
    count, so a job of full prompts that failed often is not reported as one of empty prompts."""
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, 0.0425)
    stats = Stats()
    stats.add({"rows_in": 45, "products_out": 24, "rejected": 21, "prompts": 10,
               "rejected_by_stage": {"extract": 16, "validate": 5}})
    report = build_report(META, stats, stats, [attempt], attempt)
    assert report["products_per_prompt"] == 4.0 and "Products per prompt: 4.0 (J = " in render_markdown(report)
    assert build_report(META, Stats(), Stats(), [attempt], attempt)["products_per_prompt"] is None


def test_a_job_of_no_products_reports_no_price_per_product():
    attempt = attempts.Attempt("a", 0.0, 0.5, "cpu", 0, 0.0425)
    report = build_report(META, Stats(), Stats(), [attempt], attempt)
    assert report["products_out"] == 0 and report["usd_per_1k_products"] is None
    assert "$None" not in render_markdown(report) and "n/a per 1k products" in render_markdown(report)


def test_the_report_that_marks_a_job_finished_is_written_last(tmp_path, monkeypatch):
    """_report.json marks the job finished: killed after it and before _report.md, a re-run would find
    the job complete and no _report.md; so the markdown goes first."""
    attempt = attempts.Attempt("a", 0.0, 0.5, "cpu", 0, 0.0425)
    written = []
    monkeypatch.setattr(report_module.io, "write_bytes", lambda uri, data: written.append(uri.rsplit("/", 1)[-1]))
    monkeypatch.setattr(report_module.io, "write_json", lambda uri, data: written.append(uri.rsplit("/", 1)[-1]))
    write_report(str(tmp_path), build_report(META, Stats(), Stats(), [attempt], attempt))
    assert written == ["_report.md", "_report.json"]


def test_attempt_records_round_trip(tmp_path):
    output = str(tmp_path / "out")
    first = attempts.begin(output, "cpu", 2, 0.0425, started_at=10.0)
    attempts.save(output, attempts.Attempt(first.name, 10.0, 70.0, "cpu", 2, 0.0425))
    second = attempts.begin(output, "gpu", 1, 3.77, started_at=100.0)
    loaded = attempts.load_all(output)
    assert [a.name for a in loaded] == [first.name, second.name] and loaded[0].wall_seconds == 60.0


def test_an_attempt_is_running_until_it_ends_goes_quiet_or_its_process_is_gone(tmp_path, monkeypatch):
    import os
    import socket
    import subprocess
    import sys

    output, now = str(tmp_path / "out"), time.time()
    mine = attempts.begin(output, "cpu", 0, 0.0425, started_at=now)
    here = lambda pid, ms=5: f"{int(now * 1000) - ms:015d}-{socket.gethostname()}-{pid}"  # noqa: E731
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "boot_id").write_text("0-other-boot\n")
    with monkeypatch.context() as patch:  # what another machine of this host name writes (a cloned VM)
        patch.setattr(attempts, "BOOT_ID", str(tmp_path / "boot_id"))
        another_machine = attempts.pid_namespace()
    records = {
        "elsewhere": attempts.Attempt(f"{int(now * 1000) - 1:015d}-other-host-7", now - 1, now - 10, "gpu", 1, 3.77),
        "quiet": attempts.Attempt(f"{int(now * 1000) - 2:015d}-other-host-8", now - 99, now - 46, "gpu", 1, 3.77),
        "ended": attempts.Attempt(f"{int(now * 1000) - 3:015d}-other-host-9", now - 9, now - 1, "gpu", 1, 3.77, ended=True),
        "dead here": attempts.Attempt(here(int(gone.stdout)), now - 5, now - 1, "cpu", 2, 0.0425),
        "alive here": attempts.Attempt(here(os.getppid()), now - 5, now - 1, "cpu", 2, 0.0425),
        "my pid, reused": attempts.Attempt(here(os.getpid()), now - 5, now - 1, "cpu", 2, 0.0425),
        # a container beside this one with the same host name (host networking): its pid means nothing here
        "dead here, other namespace": attempts.Attempt(here(int(gone.stdout), 6), now - 5, now - 1, "cpu", 2, 0.0425,
                                                       pid_namespace="pid:[1]"),
        "dead here, this namespace": attempts.Attempt(here(int(gone.stdout), 7), now - 5, now - 1, "cpu", 2, 0.0425,
                                                      pid_namespace=attempts.pid_namespace()),
        # another machine of the same host name (a cloned VM): the same namespace number, another boot
        "dead here, another boot": attempts.Attempt(here(int(gone.stdout), 8), now - 5, now - 1, "cpu", 2, 0.0425,
                                                    pid_namespace=another_machine),
    }
    for record in records.values():
        attempts.save(output, record)
    found = {a.name for a in attempts.running(output, mine, heartbeat_seconds=15)}
    assert found == {records["elsewhere"].name, records["alive here"].name, records["dead here, other namespace"].name,
                     records["dead here, another boot"].name}  # never mine
    assert {a.name for a in attempts.running(output, None, heartbeat_seconds=15)} == found  # mine: this process's pid
    assert re.fullmatch(r"another `hpd extract` is working on .*out \(attempt .*: host other-host, pid 7, last seen 10 s "
                        r"ago\): two at once would write the same chunks. Wait for it to end or stop it",
                        attempts._working(output, records["elsewhere"]))
    attempts.mark_taken(output, mine, heartbeat_seconds=15)  # a live one is not marked
    assert {a.name for a in attempts.running(output, mine, heartbeat_seconds=15)} == found
    for record in records.values():
        io.write_json(attempts.taken_uri(output, record.name), {"by": mine.name})  # taken over: no longer running, whatever its record says
    assert attempts.running(output, mine, heartbeat_seconds=15) == []
    for record in records.values():
        io.delete_if_exists(attempts.taken_uri(output, record.name))
    (tmp_path / "out" / attempts.DIRECTORY / "broken.json").write_text("{")  # left out of the records, with a warning
    assert len(attempts.load_all(output)) == len(records) + 1
    attempts.remove(output, records["elsewhere"])
    attempts.remove(output, records["alive here"])
    attempts.remove(output, records["dead here, other namespace"])
    attempts.remove(output, records["dead here, another boot"])
    assert attempts.running(output, mine, heartbeat_seconds=15) == []  # nothing else running


def test_a_new_attempt_waits_out_a_silent_record_and_gives_way_to_a_live_one(tmp_path, caplog):
    """A driver started again right after one was killed elsewhere (a restarted container, a
    scheduler's retry) used to be refused for up to 3 heartbeats; it now waits for the killed one's
    record to go stale. A live attempt shows itself by refreshing its record: then it gives way."""
    import threading

    output, hb = str(tmp_path / "out"), 0.5
    mine = attempts.begin(output, "cpu", 0, 0.0425, started_at=time.time())
    now = time.time()
    killed = attempts.save(output, attempts.Attempt(f"{int(now * 1000) - 1:015d}-other-host-7", now - 9, now - 0.5,
                                                    "gpu", 1, 3.77))
    started = time.monotonic()
    attempts.await_quiet(output, mine, hb, poll_seconds=0.05)  # its record goes stale at 1.5 s
    assert 0.8 < time.monotonic() - started < 5 and "waiting up to 1 s for a sign of life" in caplog.text
    attempts.remove(output, killed)

    other = attempts.save(output, attempts.Attempt(f"{int(now * 1000) - 2:015d}-other-host-8", now, now, "gpu", 1, 3.77))
    live = attempts.Heartbeat(output, other, seconds=hb / 3)
    stop = threading.Timer(20, live.stop)  # a bound, should the test fail
    stop.start()
    try:
        started = time.monotonic()
        with pytest.raises(ValueError, match="another `hpd extract` is working on .*other-host-8"):
            attempts.await_quiet(output, mine, hb, poll_seconds=0.05)
        assert time.monotonic() - started < 5  # one refresh seen, not waited out
    finally:
        stop.cancel()
        live.stop()
    attempts.await_quiet(output, mine, hb, poll_seconds=0.05)  # it ended: nothing to wait for


def test_two_attempts_started_together_both_give_way(tmp_path):
    """Each writes its record first and looks second, and refreshes it while it waits: each sees the
    other refresh, so both give way (neither runs), where waiting without refreshing would have let
    both run once the other's record went stale. Two processes (one process's own pid is never
    another attempt's)."""
    import subprocess
    import sys
    from pathlib import Path

    from pipelines import commit, io

    output = str(tmp_path / "out")
    io.write_json(io.join(output, "_job.json"), {"run_id": "r"})
    script = (
        "import sys, time\n"
        "from pipelines import build, commit\n"
        "from pipelines.progress import ProgressConfig\n"
        "from pipelines.report import ReportConfig\n"
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # both start at the same moment\n"
        "try:\n"
        "    heartbeat = build.begin_attempt(commit.OutputConfig(sys.argv[1], 'r'), build.ResourceConfig(), ReportConfig(),\n"
        "                                    ProgressConfig(heartbeat_seconds=0.5), time.time())\n"
        "    heartbeat.stop()\n"
        "    print('ran')\n"
        "except ValueError as err:\n"
        "    print('gave way' if 'another `hpd extract` is working on' in str(err) else err)\n"
    )
    at = str(time.time() + 8)  # after both have imported Ray
    repo = str(Path(__file__).resolve().parents[2])
    runs = [subprocess.Popen([sys.executable, "-c", script, output, at], cwd=repo, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    said = sorted(run.communicate(timeout=120)[0].strip() for run in runs)
    # together, both give way; on a loaded machine one may look before the other has written its
    # record, and then it runs and the other gives way; never both (as without the refresh)
    assert said in (["gave way", "gave way"], ["gave way", "ran"]), said
    assert commit.scan(output).manifests == () and all(a.ended for a in attempts.load_all(output))


def test_a_heartbeat_marks_its_attempt_ended_and_sizes_it(tmp_path):
    output = str(tmp_path)
    heartbeat = attempts.Heartbeat(output, attempts.begin(output, "cpu", 0, 0.0425, started_at=time.time()), seconds=0.01)
    heartbeat.sized("gpu", 4, 3.77)
    time.sleep(0.05)
    (record,) = attempts.load_all(output)
    assert (record.device, record.devices, record.ended) == ("gpu", 4, False)
    stopped = heartbeat.stop()
    assert stopped.ended and attempts.load_all(output) == [stopped] and heartbeat.stop() == stopped


def test_a_heartbeat_survives_a_store_that_fails_with_any_error(tmp_path, monkeypatch, caplog):
    """boto3's errors (ClientError, EndpointConnectionError) are not OSErrors: a refresh that fails
    with one is logged, the thread goes on, and ``stop`` returns the attempt as of now."""
    attempt = attempts.begin(str(tmp_path), "cpu", 2, 0.0425, started_at=1000.0)

    class ClientError(Exception):  # the shape of botocore's: not an OSError
        pass

    def failing(output, attempt):
        raise ClientError("SlowDown")

    monkeypatch.setattr(attempts, "refresh", failing)
    heartbeat = attempts.Heartbeat(str(tmp_path), attempt, seconds=0.01)
    time.sleep(0.1)
    assert heartbeat._thread.is_alive()  # not killed by the first failure
    stopped = heartbeat.stop()
    assert stopped.updated_at > attempt.updated_at and stopped.name == attempt.name
    assert "could not refresh the attempt record: ClientError: SlowDown" in caplog.text


def test_an_attempt_whose_record_lapsed_gives_way_to_the_one_that_took_over(tmp_path, monkeypatch, caplog):
    """An attempt paused (SIGSTOP) or cut off from its store for over 3 heartbeats looks stale to a
    new attempt, which takes the output over; when the first comes back it used to go on beside
    the new one and redo its chunks (helper-47, session 55). Now its next refresh looks first: with
    another attempt running it stops refreshing, and ``check`` raises; with none, it goes on."""
    output, hb = str(tmp_path / "out"), 0.05
    mine = attempts.begin(output, "cpu", 2, 0.0425, started_at=time.time())
    cut_off = True
    store = attempts.refresh

    def refresh(out, attempt):
        if cut_off:
            raise OSError("the store cannot be reached")
        return store(out, attempt)

    monkeypatch.setattr(attempts, "refresh", refresh)
    heartbeat = attempts.Heartbeat(output, mine, seconds=hb)
    time.sleep(4 * hb)  # lapsed, and nobody took over: it refreshes again once the store is back
    cut_off = False
    time.sleep(4 * hb)
    assert heartbeat.lost is None and attempts.load_all(output)[0].updated_at > mine.updated_at
    heartbeat.check()

    cut_off = True
    time.sleep(4 * hb)
    now = time.time()  # another attempt waited out the silent record and runs
    taker = attempts.Heartbeat(output, attempts.save(output, attempts.Attempt(
        f"{int(now * 1000):015d}-other-host-9", now, now, "gpu", 1, 3.77)), seconds=hb)
    try:
        silent = attempts.load_all(output)[0].updated_at
        cut_off = False
        time.sleep(4 * hb)
        assert heartbeat.lost is not None and "-other-host-9" in heartbeat.lost
        assert attempts.load_all(output)[0].updated_at == silent  # it no longer refreshes
        with pytest.raises(attempts.LostLeaseError, match="lost its lease .*-other-host-9 .*took the output over"):
            heartbeat.check()
        assert "lost its lease" in caplog.text
        assert heartbeat.stop().ended  # nor writes its record when it stops: the output is another's now
        assert attempts.load_all(output)[0].updated_at == silent  # its time up to the pause still counts
    finally:
        taker.stop()


def test_an_attempt_waited_out_is_marked_taken_and_loses_its_lease_when_it_wakes_up(tmp_path):
    """A driver paused longer than 3 heartbeats (SIGSTOP, a frozen VM) is waited out by a new attempt;
    when it woke up it went on writing into the output beside the new one, and after an --overwrite
    into the new job's files (helper-50, session 56: 8 products lost, 28 written by both runs). The
    new attempt now marks the record it waited out taken, in a file the paused one never writes:
    its heartbeat then stops refreshing, never writes its record again, and its writers refuse."""
    from pipelines import commit

    output, hb = str(tmp_path / "out"), 0.05
    now = time.time()
    paused = attempts.save(output, attempts.Attempt(f"{int(now * 1000) - 9:015d}-other-host-7", now - 9, now - 1,
                                                    "cpu", 1, 0.0425))
    taker = attempts.begin(output, "cpu", 0, 0.0425, started_at=now)
    attempts.await_quiet(output, taker, hb)  # stale: goes on at once, and marks it
    assert io.read_json(attempts.taken_uri(output, paused.name))["by"] == taker.name
    assert attempts.lease_lost(output, taker.name) is None

    heartbeat = attempts.Heartbeat(output, paused, seconds=hb)  # it wakes up
    time.sleep(4 * hb)
    assert heartbeat.lost is not None and f"attempt {taker.name} (host " in heartbeat.lost
    with pytest.raises(attempts.LostLeaseError, match="lost its lease .* took the output over"):
        heartbeat.check()
    heartbeat.stop()
    record = next(a for a in attempts.load_all(output) if a.name == paused.name)
    assert record == paused  # never written again
    with pytest.raises(attempts.LostLeaseError, match="took the output over"):
        commit.check_lease(commit.OutputConfig(output, "r", attempt=paused.name))
    commit.check_lease(commit.OutputConfig(output, "r", attempt=taker.name))
    commit.check_lease(commit.OutputConfig(output, "r"))  # no attempt named: not checked

    attempts.remove(output, taker)  # its record gone: an --overwrite deleted the output meanwhile
    with pytest.raises(attempts.LostLeaseError, match="record is gone: the output was deleted"):
        commit.check_lease(commit.OutputConfig(output, "r", attempt=taker.name))
    attempts.save(output, taker)
    commit.close(output, str(tmp_path / "night-2"))  # a later --skip-existing job closed it
    with pytest.raises(attempts.LostLeaseError, match="--skip-existing` for .*night-2 closed it"):
        commit.check_lease(commit.OutputConfig(output, "r", attempt=taker.name))
    closed = attempts.Heartbeat(output, taker, seconds=hb, also=lambda: commit.closed_reason(output))
    time.sleep(4 * hb)
    assert "closed it" in (closed.lost or "")
    closed.stop()


def test_a_close_by_a_job_that_left_its_output_is_taken_back(tmp_path):
    """A --skip-existing job that closed an unfinished output and then failed before it committed
    anything deletes its own output: its close took over nothing, and left the earlier job refused
    for good (helper-50, session 56). A resume now takes such a close back."""
    from pipelines import commit

    earlier, later = str(tmp_path / "dt=1"), str(tmp_path / "dt=2")
    io.write_json(io.join(later, "_job.json"), {"run_id": "r2"})
    commit.close(earlier, later)
    with pytest.raises(ValueError, match="is closed"):
        commit.check_open(earlier)  # the later job holds its output: it took the products over
    io.delete_if_exists(io.join(later, "_job.json"))  # it failed and deleted what it wrote
    commit.check_open(earlier)
    assert not io.exists(io.join(earlier, commit.CLOSED))


def test_an_overwrite_deletes_under_a_lease_that_an_attempt_starting_meanwhile_respects(tmp_path, monkeypatch):
    """--overwrite used to delete without a record of its own: an attempt started during a long (S3)
    delete found nobody running, and the rest of the delete took its files (helper-29, session 51)."""
    import os
    import subprocess
    import sys

    from pipelines import build, commit, io

    output, now = str(tmp_path / "out"), time.time()
    io.write_json(io.join(output, "_job.json"), {"run_id": "old"})
    io.write_json(io.join(output, "_commits", "s", "000000.json"), {})
    attempts.save(output, attempts.Attempt("000000000000001-other-host-7", now - 99, now - 90, "cpu", 1, 0.04, ended=True))
    probe = "import sys; from pipelines import attempts; sys.exit(1 if attempts.running(sys.argv[1], None, 15) else 0)"
    seen, discard = {}, commit.discard

    def discard_and_look(uri, keep=None):  # another process starts on the output while the files go
        seen["probe"] = subprocess.run([sys.executable, "-c", probe, output], capture_output=True, text=True,
                                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        discard(uri, keep)
        seen["left"] = io.list_files(output)

    monkeypatch.setattr(commit, "discard", discard_and_look)
    build.delete_under_lease(output)
    assert seen["probe"].returncode == 1, seen["probe"].stderr  # it sees the delete's lease
    (lease,) = seen["left"]  # everything but the lease, which goes last
    assert lease.startswith(io.join(output, attempts.DIRECTORY)) and io.list_files(output) == []

    io.write_json(io.join(output, "_job.json"), {"run_id": "old"})
    other = attempts.save(output, attempts.Attempt(f"{int(now * 1000):015d}-other-host-8", now, time.time(), "cpu", 1, 0.04))
    live = attempts.Heartbeat(output, other, seconds=0.2)  # a job at work (refreshing its record) is not deleted
    try:
        with pytest.raises(ValueError, match="another `hpd extract` is working on"):
            build.delete_under_lease(output)
        kept = [f for f in io.list_files(output) if "/.tmp-" not in f]  # not a refresh's file on its way
        assert len(kept) == 2 and len(attempts.load_all(output)) == 1  # its files and record, not ours
    finally:
        live.stop()


def test_batches_by_step_shape_are_summed_and_reported():
    attempt = attempts.Attempt("a", 0.0, 10.0, "gpu", 1, 3.77)
    total = stats(2)
    total.add({"rows_in": 1, "products_out": 1, "batches_fixed_steps": 2, "batches_packed_steps": 1})
    total.add({"rows_in": 1, "products_out": 1, "batches_packed_steps": 3})  # a chunk without fixed batches
    report = build_report(META, total, total, [attempt], attempt)
    assert (report["batches_fixed_steps"], report["batches_packed_steps"]) == (2, 4)
    assert "Engine batches: 2 with fixed steps, 4 with packed steps" in render_markdown(report)
    none = stats(2)
    assert "Engine batches" not in render_markdown(build_report(META, none, none, [attempt], attempt))  # a dry run


def test_failed_cuda_graph_captures_are_summed_and_reported_only_when_there_are_some():
    attempt = attempts.Attempt("a", 0.0, 10.0, "gpu", 1, 3.77)
    clean, failing = stats(2), stats(2)
    failing.add({"rows_in": 1, "products_out": 1, "cuda_graph_failures": 2})
    failing.add({"rows_in": 1, "products_out": 1, "cuda_graph_failures": 1})
    report = build_report(META, failing, failing, [attempt], attempt)
    assert report["cuda_graph_failures"] == 3 and "CUDA graph captures failed: 3" in render_markdown(report)
    report = build_report(META, clean, clean, [attempt], attempt)
    assert report["cuda_graph_failures"] == 0 and "CUDA graph" not in render_markdown(report)


def test_per_category_counts_are_summed_over_chunks_and_name_the_schema_categories_without_products():
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, 0.0425)
    first, second = Stats(), Stats()
    first.add({"rows_in": 3, "products_out": 3, "by_category": {
        "Tea": {"products": 2, "attribute_rows": 6, "values": 5}, "Coffee": {"products": 1, "attribute_rows": 2}}})
    second.add({"rows_in": 2, "products_out": 1, "by_category": {"Tea": {"products": 1, "attribute_rows": 3, "values": 3}}})
    second.add({"rows_in": 1, "by_category": {}})  # a chunk whose every row was rejected
    total = first.merged(second)
    report = build_report(META, total, second, [attempt], attempt, schema_categories={"Tea": (), "Coffee": (), "Wine": ()})
    assert report["by_category"] == {
        "Coffee": {"products": 1, "attribute_rows": 2, "values": 0, "null_share": 1.0},
        "Tea": {"products": 3, "attribute_rows": 9, "values": 8, "null_share": 0.1111},
    }
    assert report["categories_without_products"] == ["Wine"]
    text = render_markdown(report)
    assert "| Tea | 3 | 8 | 9 | 11.1% |" in text and "| Coffee | 1 | 0 | 2 | 100.0% |" in text
    assert text.index("| Tea |") < text.index("| Coffee |")  # most products first
    assert "Schema categories without products (1): Wine" in text


def test_per_category_counts_are_left_out_when_some_chunk_has_none():
    """A job resumed from chunks of an older version: their categories are unknown, so no per-category
    figures (they would not add up to the job's), rather than partial ones."""
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, 0.0425)
    total = Stats()
    total.add({"rows_in": 1, "products_out": 1, "by_category": {"Tea": {"products": 1, "attribute_rows": 3, "values": 3}}})
    total.add({"rows_in": 1, "products_out": 1})  # committed before 2026-12-01
    report = build_report(META, total, total, [attempt], attempt, schema_categories={"Tea": (), "Wine": ()})
    assert report["by_category"] is None and report["categories_without_products"] is None
    assert "null share" not in render_markdown(report) and "without products" not in render_markdown(report)


def test_the_per_category_table_shows_the_largest_categories_and_escapes_bars(monkeypatch):
    monkeypatch.setattr(report_module, "CATEGORY_ROWS_SHOWN", 2)
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, 0.0425)
    total = Stats()
    total.add({"rows_in": 6, "products_out": 6, "by_category": {
        "A|B": {"products": 3, "attribute_rows": 3, "values": 3}, "C": {"products": 2, "attribute_rows": 2, "values": 1},
        "D": {"products": 1, "attribute_rows": 1, "values": 1}}})
    text = render_markdown(build_report(META, total, total, [attempt], attempt))
    assert "| A\\|B | 3 |" in text and "| C | 2 |" in text and "| D |" not in text
    assert "1 more categories in `_report.json`" in text
